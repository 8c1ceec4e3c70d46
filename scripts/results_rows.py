"""Print `docs/results.md` table rows from the result folders they cite.

    python scripts/results_rows.py short-solution-five-test-seeds:malt:3 \
        short-solution-five-test-seeds:label_pairs:1 --machine "AVX2 + AVX-512 EPYC, 2 cores"

Each row: arm, iteration, seeds, decided accuracy and AUC with their 95 % CIs, accept rate,
minutes per seed up to that iteration, machine, the folder's commits and a link to the folder.
`tests/test_results_page.py` recomputes every number of the page the same way.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from nip_core.run.iteration_files import PROVENANCE_FILE

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"


def value_ci(row: pd.Series, column: str) -> str:
    low, high = row[f"{column}_ci_low"], row[f"{column}_ci_high"]
    return f"{row[column]:.3f} [{low:.3f}, {high:.3f}]"


def minutes(across: pd.DataFrame, iteration: int) -> str:
    """The arm's mean wall time per seed over iterations 1..`iteration` ("–" where none)."""
    walls = across[(across["iteration"] >= 1) & (across["iteration"] <= iteration)]
    walls = walls["wall_seconds"].dropna()
    return "–" if iteration == 0 or walls.empty else str(round(walls.sum() / 60))


def commits(folder: Path) -> str:
    commit = json.loads((folder / PROVENANCE_FILE).read_text())["commit"]
    shown = commit if isinstance(commit, list) else [commit]
    return ", ".join(c if c == "unknown" else c[:7] for c in shown)


def table_cells(folder_name: str, arm: str, iteration: int, machine: str) -> list[str]:
    """A row's cells: what the page must print for `arm` at `iteration` of the folder."""
    folder = RESULTS / folder_name
    summary = pd.read_parquet(folder / "summary.parquet")
    across = summary[(summary["scope"] == "across_seeds") & (summary["arm"] == arm)]
    row = across[across["iteration"] == iteration]
    if len(row) != 1:
        raise SystemExit(f"error: {folder_name} has no across-seed row for {arm} at {iteration}")
    row = row.iloc[0]
    if math.isnan(row["auc"]):
        raise SystemExit(f"error: {folder_name} {arm} at {iteration} has no AUC")
    return [
        f"`{arm}`",
        str(iteration),
        str(int(row["seeds"])),
        value_ci(row, "accuracy_when_decided"),
        value_ci(row, "auc"),
        f"{row['accept_rate']:.3f}",
        minutes(across, iteration),
        machine,
        commits(folder),
        f"[{folder_name}](results/{folder_name}/)",
    ]


def table_row(folder_name: str, arm: str, iteration: int, machine: str) -> str:
    return "| " + " | ".join(table_cells(folder_name, arm, iteration, machine)) + " |"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="+", help="folder:arm:iteration")
    parser.add_argument("--machine", default="–", help="the machine cell, as the page names it")
    args = parser.parse_args(argv)
    for spec in args.rows:
        folder, arm, iteration = spec.split(":")
        print(table_row(folder, arm, int(iteration), args.machine))


if __name__ == "__main__":
    main()
