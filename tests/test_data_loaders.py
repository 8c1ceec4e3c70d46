"""load_dataset: names, splits, errors, reduction, the synthetic set and buggy-apps processing."""

from __future__ import annotations

import random
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nip_core.data import datapoints, humaneval_file, load_dataset, load_for_parameters
from nip_core.data.buggy_apps import process_buggy_apps
from nip_core.data.stable import prover_stance
from nip_core.episode import Datapoint


def _solutions(*texts: str) -> list[dict[str, object]]:
    return [{"solution": text, "passed": True} for text in texts]


def _hub_frame() -> pd.DataFrame:
    """Four hub rows: one of another difficulty, one flagged, and two with uneven lists."""
    return pd.DataFrame(
        {
            "difficulty": ["interview", "introductory", "interview", "interview"],
            "flags": ["", "", "violence", None],
            "question": ["Q0", "Q1", "Q2", "Q3"],
            # Q0 has more correct than buggy solutions, Q3 more buggy than correct: the reference's
            # buggy loop (testing len(solutions)) would index past Q0's buggy list and miss "b3y".
            "solutions": [_solutions("s0a", "s0b"), _solutions("s1a"), _solutions("s2a"), _solutions("s3a")],
            "buggy_solutions": [_solutions("b0a"), _solutions("b1a"), _solutions("b2a"), _solutions("b3x", "b3y")],
            "problem_id": [10, 11, 12, 13],
        }
    )  # fmt: skip


def _write_hub(folder: Path, split: str) -> Path:
    path = folder / f"{split}.parquet"
    pq.write_table(pa.Table.from_pandas(_hub_frame(), preserve_index=False), path)
    return path


def test_buggy_apps_k_loop_order_filters_and_fixed_buggy_loop(tmp_path: Path) -> None:
    _write_hub(tmp_path, "train")
    frame = load_dataset("buggy-apps", "train", path=str(tmp_path))
    assert frame["solution"].tolist() == ["s0a", "s3a", "s0b", "b0a", "b3x", "b3y"]
    assert frame["y"].tolist() == [1, 1, 1, 0, 0, 0]
    assert frame["question"].tolist() == ["Q0", "Q3", "Q0", "Q0", "Q3", "Q3"]
    assert frame["id"].tolist() == list(range(6))
    assert frame["prover_stance"].tolist() == [prover_stance(s) for s in frame["solution"]]
    assert str(frame["id"].dtype) == "int64" and str(frame["y"].dtype) == "int64"


def test_buggy_apps_difficulty_flags_and_file_path(tmp_path: Path) -> None:
    path = _write_hub(tmp_path, "test")
    with_flagged = load_dataset("buggy-apps", "test", path=str(path), exclude_flagged=False)
    assert "s2a" in with_flagged["solution"].tolist() and len(with_flagged) == 8
    intro = load_dataset("lrhammond/buggy-apps", "test", path=str(path), difficulty="introductory")
    assert intro["solution"].tolist() == ["s1a", "b1a"]
    with pytest.raises(ValueError, match="difficulty"):
        load_dataset("buggy-apps", "test", path=str(path), difficulty="hard")


def test_buggy_apps_hub_data_folder_layout(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    frame = pd.DataFrame(_hub_frame())
    pq.write_table(pa.Table.from_pandas(frame), tmp_path / "data" / "test-00000-of-00001.parquet")
    assert len(load_dataset("buggy-apps", "test", path=str(tmp_path))) == 6
    with pytest.raises(FileNotFoundError, match="train"):
        load_dataset("buggy-apps", "train", path=str(tmp_path))


def test_buggy_apps_without_path_explains_how_to_pass_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(FileNotFoundError, match="local Parquet file or directory"):
        load_dataset("buggy-apps", "train")


def test_buggy_apps_bad_solution_records_are_rejected() -> None:
    hub = _hub_frame()
    hub.at[0, "solutions"] = ["not a record"]
    with pytest.raises(ValueError, match="'solutions'"):
        process_buggy_apps(hub)


def test_humaneval_split_columns_and_order() -> None:
    frame = load_dataset("humaneval-buggy", "test")
    expected = {"id", "question", "solution", "y", "prover_stance", "problem_id", "mutation"}
    assert expected <= set(frame.columns)
    assert frame["id"].is_monotonic_increasing and list(frame.index) == list(range(len(frame)))
    assert set(frame["split"]) == {"test"}


def test_max_size_uses_the_seeded_sample() -> None:
    full = load_dataset("humaneval-buggy", "train")
    small = load_dataset("humaneval-buggy", "train", max_size=7, shuffle_seed=3)
    positions = random.Random(3).sample(range(len(full)), 7)
    assert small["id"].tolist() == full["id"].iloc[positions].tolist()
    assert load_dataset("humaneval-buggy", "train", max_size=10_000)["id"].equals(full["id"])
    other = load_dataset("humaneval-buggy", "train", max_size=7, shuffle_seed=4)
    assert other["id"].tolist() != small["id"].tolist()


def test_synthetic_test_dataset() -> None:
    train = load_dataset("test", "train", seed=5)
    assert train["question"].tolist() == [f"Question {i}" for i in range(10)]
    assert train["solution"].tolist() == [f"Solution {i}" for i in range(10)]
    assert (train["prover_stance"] == 1).all() and set(train["y"]) <= {0, 1}
    assert train.equals(load_dataset("test", "train", seed=5))
    labels = {
        tuple(load_dataset("test", s, seed=k)["y"]) for s in ("train", "test") for k in range(4)
    }
    assert len(labels) > 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": "nope", "split": "train"}, ValueError, "unknown dataset 'nope'"),
        ({"name": "test", "split": "validation"}, ValueError, "split must be one of"),
        ({"name": "test", "split": "train", "max_size": -1}, ValueError, "max_size"),
        ({"name": "humaneval-buggy", "split": "train", "path": "/no/such.parquet"}, FileNotFoundError, "/no/such.parquet"),
        ({"name": "buggy-apps", "split": "train", "path": "/no/such/dir"}, FileNotFoundError, "/no/such/dir"),
    ],
)  # fmt: skip
def test_bad_arguments_raise_clear_errors(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        load_dataset(**kwargs)


def test_corrupt_and_incomplete_files_are_named(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_text("this is not parquet")
    with pytest.raises(ValueError, match=r"corrupt\.parquet is not a readable Parquet file"):
        load_dataset("humaneval-buggy", "train", path=str(corrupt))
    partial = tmp_path / "partial.parquet"
    table = pq.read_table(humaneval_file()).drop_columns(["prover_stance"])
    pq.write_table(table, partial)
    with pytest.raises(
        ValueError, match=r"partial\.parquet lacks required columns \['prover_stance'\]"
    ):
        load_dataset("humaneval-buggy", "train", path=str(partial))
    hub = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pandas(_hub_frame().drop(columns=["flags"])), hub)
    with pytest.raises(ValueError, match=r"lacks required columns \['flags'\]"):
        load_dataset("buggy-apps", "train", path=str(tmp_path))


def test_load_for_parameters_maps_the_options(tmp_path: Path) -> None:
    _write_hub(tmp_path, "test")
    options = SimpleNamespace(max_test_size=2, reduce_shuffle_seed=1, local_path=str(tmp_path))
    scenario = SimpleNamespace(apps_difficulty="interview", apps_exclude_flagged=False)
    frame = load_for_parameters("buggy-apps", "test", options=options, code_validation=scenario)
    full = load_dataset("buggy-apps", "test", path=str(tmp_path), exclude_flagged=False)
    positions = random.Random(1).sample(range(len(full)), 2)
    assert frame["id"].tolist() == full["id"].iloc[positions].tolist()


def test_datapoints_convert_rows() -> None:
    frame = load_dataset("humaneval-buggy", "test", max_size=3)
    points = datapoints(frame)
    assert all(isinstance(point, Datapoint) for point in points)
    assert [p.id for p in points] == frame["id"].tolist()
    assert all(type(p.y) is int and type(p.prover_stance) is int for p in points)
    assert points[0].solution == frame["solution"].iloc[0]
    with pytest.raises(ValueError, match="solution"):
        datapoints(frame.drop(columns=["solution"]))
