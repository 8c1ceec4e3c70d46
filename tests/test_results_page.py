"""docs/results.md: every number in its tables is recomputed from the rows it cites.

A table row names its result folder last (`[name](results/name/)`); its arm, iteration and seed
count pick the folder's across-seed summary row, whose decided accuracy (`accuracy_when_decided`)
and AUC with their CIs, and accept rate, must read as the page prints them (three decimals); the
minutes are the arm's mean wall time per seed up to that iteration (`wall_seconds`, "–" where
none was recorded); the commit cell lists the folder's provenance commits (seven characters, or
"unknown"). The README's learning part stays short.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "results.md"
ROW = re.compile(r"^\|(.+)\|\s*\[([\w.-]+)\]\(results/([\w.-]+)/?\)\s*\|$")
VALUE_CI = re.compile(r"^([0-9.]+) \[([0-9.]+), ([0-9.]+)\]$")


def table_rows() -> list[tuple[list[str], str]]:
    """(cells before the folder, folder) of every table row that cites a result folder."""
    rows = []
    for line in PAGE.read_text().splitlines():
        match = ROW.match(line.strip())
        if match:
            assert match[2] == match[3], f"link text and target differ: {line}"
            rows.append(([c.strip() for c in match[1].split("|")], match[3]))
    return rows


def three(value: float) -> str:
    return f"{value:.3f}"


def test_the_page_is_short_and_cites_rows():
    assert len(PAGE.read_text().splitlines()) <= 250
    assert len(table_rows()) >= 20


@pytest.mark.parametrize("row", table_rows(), ids=lambda r: f"{r[1]}:{r[0][0]}:{r[0][1]}")
def test_every_number_is_recomputed_from_its_folder(row):
    cells, folder = row
    arm_cell, iteration, seeds, decided, auc, accept, minutes, _machine, commit = cells
    arm = re.search(r"`([\w-]+)`", arm_cell)[1]
    summary = pd.read_parquet(ROOT / "docs" / "results" / folder / "summary.parquet")
    across = summary[(summary["scope"] == "across_seeds") & (summary["arm"] == arm)]
    match = across[across["iteration"] == int(iteration)]
    assert len(match) == 1, f"{folder} has no across-seed row for {arm} at {iteration}"
    got = match.iloc[0]
    assert int(got["seeds"]) == int(seeds)
    for cell, column in ((decided, "accuracy_when_decided"), (auc, "auc")):
        value, low, high = VALUE_CI.match(cell).groups()
        expected = (got[column], got[f"{column}_ci_low"], got[f"{column}_ci_high"])
        assert (value, low, high) == tuple(three(x) for x in expected), (cell, column)
    assert accept == three(got["accept_rate"])
    walls = across[(across["iteration"] >= 1) & (across["iteration"] <= int(iteration))]
    walls = walls["wall_seconds"].dropna()
    expected_minutes = "–" if int(iteration) == 0 or walls.empty else str(round(walls.sum() / 60))
    assert minutes == expected_minutes
    provenance = json.loads((ROOT / "docs" / "results" / folder / "provenance.json").read_text())
    commits = (
        provenance["commit"] if isinstance(provenance["commit"], list) else [provenance["commit"]]
    )
    shown = [c if c == "unknown" else c[:7] for c in commits]
    assert commit == ", ".join(shown)


def test_the_readme_learning_part_is_at_most_40_lines():
    text = (ROOT / "README.md").read_text()
    part = text.split("## Does training make a better verifier?", 1)[1].split("\n## ", 1)[0]
    assert len(part.strip().splitlines()) <= 40
