"""Every result folder says which commit, configuration, machine and command made it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from nip_core.run import provenance

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
FOLDERS = sorted(p for p in RESULTS.iterdir() if p.is_dir())


@pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])
def test_every_result_folder_holds_its_provenance(folder: Path):
    path = folder / provenance.PROVENANCE_FILE
    assert path.is_file(), f"{folder.name} has no {provenance.PROVENANCE_FILE}"
    record = json.loads(path.read_text())
    missing = [field for field in provenance.RESULT_FIELDS if field not in record]
    assert not missing, f"{folder.name}: provenance lacks {missing}"
    commits = record["commit"] if isinstance(record["commit"], list) else [record["commit"]]
    for commit in commits:  # a full hash, or "unknown" where it could not be recovered
        assert commit == provenance.UNKNOWN or (len(commit) == 40 and int(commit, 16) >= 0)


def test_label_pair_rows_are_stored_under_their_arm_name():
    for name in ("easy-label-pairs", "rung-b-rows64"):
        arms = set(pd.read_parquet(RESULTS / name / "summary.parquet")["arm"])
        assert "label_pairs" in arms and "malt" not in arms, (name, arms)


def test_combined_provenance_keeps_every_invocation_and_arm():
    run = {
        "commit": "a" * 40,
        "dirty": False,
        "machine": {"cpu": "x"},
        "packages": {"torch": "2.13.0"},
        "command": ["python", "-m", "flows.experiment"],
        "started": "2026-11-29T01:00:00+00:00",
        "ended": "2026-11-29T01:30:00+00:00",
    }
    later = run | {"commit": "b" * 40, "started": "2026-11-29T02:00:00+00:00", "ended": None}
    combined = provenance.result_provenance(
        {
            "e1": {"invocations": [run], "arms": {"malt": {"seed": 1}}},
            "e2": {"invocations": [later]},
        },
        ["combine"],
    )
    assert combined["commit"] == ["a" * 40, "b" * 40] and combined["dirty"] is False
    assert combined["configuration"] == {"malt": {"seed": 1}} and len(combined["sources"]) == 2
    assert combined["wall_time"] == 1800.0  # the unfinished invocation is not counted
    assert not [f for f in provenance.RESULT_FIELDS if f not in combined]

    # A result folder combined with a new experiment keeps every earlier invocation.
    newest = run | {"commit": "c" * 40}
    again = provenance.result_provenance(
        {"published": combined, "e3": {"invocations": [newest], "arms": {"nip": {}}}}, ["again"]
    )
    assert again["commit"] == ["a" * 40, "b" * 40, "c" * 40]
    assert [s["experiment"] for s in again["sources"]] == ["e1", "e2", "e3"]
    assert set(again["command"]) == {"e1", "e2", "e3"} and again["wall_time"] == 3600.0
    assert again["configuration"] == {"malt": {"seed": 1}, "nip": {}}
    # ... and a run folder published before and extended since stays one experiment
    extended = provenance.result_provenance(
        {"published": combined, "e2": {"invocations": [newest]}}, ["extended"]
    )
    assert [s["experiment"] for s in extended["sources"]] == ["e1", "e2", "e2"]
    assert len(extended["command"]["e2"]) == 1  # the same command twice, listed once
