"""Write a run's self-contained `report.html` (plots, pair statistics, response trees).

    python -m flows.report artifacts/exp1                     # -> artifacts/exp1/report.html
    python -m flows.report artifacts/exp1 --out /tmp/r.html --trees 5 --iteration 0

The page embeds everything (PNG plots as data URIs, trees as inline SVG): open it from disk,
mail it, attach it to a ticket; it needs no network and no JavaScript. Plain CLI, no Prefect
server needed.
"""

from __future__ import annotations

import argparse
import sys

from nip_core.report.html import build_report
from nip_core.report.run_reader import read_run
from nip_core.run.artifacts import ArtifactError, write_bytes
from nip_core.run.iteration_files import REPORT_FILE


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m flows.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("run", help="run folder (<artifacts root>/<run name>), local or fsspec URL")
    parser.add_argument("--out", help="where to write the page (default: <run folder>/report.html)")
    parser.add_argument("--trees", type=int, default=3, help="how many response trees to draw")
    parser.add_argument(
        "--iteration", type=int, help="iteration whose trees are drawn (default: the latest)"
    )
    args = parser.parse_args(argv)
    if args.trees < 0:
        parser.error(f"--trees must be >= 0, got {args.trees}")
    return args


def write_report(
    run_path: str, out: str | None = None, trees: int = 3, iteration: int | None = None
) -> str:
    """Build the report of the run at `run_path` and write it; returns where it went."""
    run = read_run(run_path)
    page = build_report(run, trees=trees, iteration=iteration)
    if out is None:
        path = f"{run.paths.run_dir}/{REPORT_FILE}"
        write_bytes(run.paths.fs, path, page.encode("utf-8"))
        return path
    import fsspec

    fs, path = fsspec.core.url_to_fs(out)
    write_bytes(fs, path, page.encode("utf-8"))
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        where = write_report(args.run, args.out, args.trees, args.iteration)
    except ArtifactError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
