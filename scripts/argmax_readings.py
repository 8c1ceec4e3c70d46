"""Sampled against argmax accuracy of every arm in result folders, recomputed from their episodes.

    python scripts/argmax_readings.py fill-in-choice-test fill-in-choice-control

A verifier evaluated at its own temperature can read higher after training only because it
samples its preferred verdict more surely. The argmax of its P(accept) (the verdict at temperature
0) moves only where its preference moved. This recomputes `summary_table` from each folder's
`experiment.parquet` with today's code (folders written before `argmax_accuracy` existed lack the
column) and prints, per seed, arm and iteration: decided accuracy, argmax accuracy with its 95 %
CI, and the argmax's paired difference from the seed's base model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from nip_core.experiment.summary import summary_table  # noqa: E402

RESULTS = REPO / "docs" / "results"


def readings(folder: Path, resamples: int) -> pd.DataFrame:
    """The folder's per-seed rows with the columns this script prints."""
    table = summary_table(pd.read_parquet(folder / "experiment.parquet"), resamples=resamples)
    table = table[table["scope"] == "seed"]
    columns = ["seed", "arm", "iteration", "accuracy_when_decided", "argmax_accuracy"]
    columns += ["argmax_accuracy_ci_low", "argmax_accuracy_ci_high", "argmax_diff_vs_base"]
    columns += ["argmax_diff_ci_low", "argmax_diff_ci_high"]
    return table[columns].reset_index(drop=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="folders under docs/results (or paths)")
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args()
    for name in args.folders:
        folder = Path(name) if Path(name).is_dir() else RESULTS / name
        print(f"{folder.name}:")
        for row in readings(folder, args.resamples).itertuples():
            print(
                f"  seed {row.seed} {row.arm} it {row.iteration}: decided "
                f"{row.accuracy_when_decided:.3f}, argmax {row.argmax_accuracy:.3f} "
                f"[{row.argmax_accuracy_ci_low:.3f}, {row.argmax_accuracy_ci_high:.3f}], "
                f"vs base {row.argmax_diff_vs_base:+.3f} "
                f"[{row.argmax_diff_ci_low:+.3f}, {row.argmax_diff_ci_high:+.3f}]"
            )


if __name__ == "__main__":
    main()
