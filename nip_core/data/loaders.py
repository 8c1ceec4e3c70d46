"""Load a code-validation dataset split as a DataFrame, and turn rows into `Datapoint`s.

Datasets:

* "humaneval-buggy" — the shipped offline HumanEval file (one correct and one buggy solution per
  problem, split by problem); see `nip_core.data.humaneval`. `bug_difficulty`
  (`dataset_options.difficulty`) picks which buggy solution: "mixed" (default, the original
  rows), "easy", "medium" or "hard"; see `nip_core.data.difficulty`.
* "buggy-apps" (alias "lrhammond/buggy-apps") — the reference's hub dataset from a local copy.
* "test" — 10 synthetic rows for fast tests, deterministic given `seed`.

Usage::

    frame = load_dataset("humaneval-buggy", "train", max_size=50)
    easy = load_dataset("humaneval-buggy", "train", bug_difficulty="easy")
    points = datapoints(frame)
"""

from __future__ import annotations

import importlib.resources
import random
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from nip_core.data.buggy_apps import process_buggy_apps, read_hub_split
from nip_core.data.difficulty import DEFAULT_DIFFICULTY, OPTION, check_difficulty
from nip_core.data.docstrings import (
    DEFAULT_SOLUTION_DOCSTRING,
    check_solution_docstring,
    without_repeated_docstrings,
)
from nip_core.data.parquet import read_parquet_frame
from nip_core.data.stable import stable_seed
from nip_core.episode import Datapoint

Split = Literal["train", "test"]
SPLITS: tuple[str, ...] = ("train", "test")
DATASET_NAMES: tuple[str, ...] = ("humaneval-buggy", "buggy-apps", "test")
_ALIASES = {"lrhammond/buggy-apps": "buggy-apps"}
HUMANEVAL_FILE = "humaneval_buggy.parquet"
DATAPOINT_COLUMNS = ("id", "question", "solution", "y", "prover_stance")
HUMANEVAL_COLUMNS = (*DATAPOINT_COLUMNS, "problem_id", "mutation", "split")
TEST_DATASET_SIZE = 10


def load_dataset(
    name: str,
    split: Split,
    *,
    path: str | None = None,
    max_size: int | None = None,
    shuffle_seed: int = 42,
    seed: int = 0,
    difficulty: str = "interview",
    exclude_flagged: bool = True,
    bug_difficulty: str = DEFAULT_DIFFICULTY,
    solution_docstring: str = DEFAULT_SOLUTION_DOCSTRING,
) -> pd.DataFrame:
    """One split of a named dataset, with at least the columns id, question, solution, y,
    prover_stance.

    Args:
        name: "humaneval-buggy", "buggy-apps" (or "lrhammond/buggy-apps") or "test".
        split: "train" or "test".
        path: Local file (or, for buggy-apps, a directory with `{train,test}.parquet`) to read
            instead of the default source.
        max_size: Keep at most this many rows, chosen with `random.Random(shuffle_seed).sample`
            as the reference does; None keeps all.
        shuffle_seed: Seed of that reduction.
        seed: Seed of the synthetic "test" dataset's labels (ignored by the others).
        difficulty: APPS difficulty kept from buggy-apps.
        exclude_flagged: Drop buggy-apps rows flagged by moderation.
        bug_difficulty: How visible humaneval-buggy's bugs are (`dataset_options.difficulty`):
            "mixed" (the original rows), "easy", "medium" or "hard". Other datasets accept only
            "mixed".
        solution_docstring: "kept" shows each solution as it is; "dropped" removes the
            docstrings it repeats from its question (`dataset_options.solution_docstring`, see
            `nip_core.data.docstrings`).

    Returns:
        A DataFrame with a fresh RangeIndex.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if max_size is not None and (not isinstance(max_size, int) or max_size < 0):
        raise ValueError(f"max_size must be a non-negative int or None, got {max_size!r}")
    check_difficulty(bug_difficulty)
    check_solution_docstring(solution_docstring)
    canonical = _ALIASES.get(name, name)
    if canonical in ("buggy-apps", "test") and bug_difficulty != DEFAULT_DIFFICULTY:
        raise ValueError(
            f"{OPTION}={bug_difficulty!r} needs dataset 'humaneval-buggy'; "
            f"dataset {name!r} has only {DEFAULT_DIFFICULTY!r}"
        )
    if canonical == "humaneval-buggy":
        frame = humaneval_buggy_split(split, path, bug_difficulty)
    elif canonical == "buggy-apps":
        frame = process_buggy_apps(read_hub_split(path, split), difficulty, exclude_flagged)
    elif canonical == "test":
        frame = synthetic_test_split(split, seed)
    else:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {DATASET_NAMES}")
    return shown_solutions(reduced(frame, max_size, shuffle_seed), solution_docstring)


def shown_solutions(frame: pd.DataFrame, solution_docstring: str) -> pd.DataFrame:
    """The rows with each solution as `solution_docstring` shows it: "kept" as it is, "dropped"
    without the docstrings its question repeats."""
    if solution_docstring == "kept":
        return frame
    shown = [
        without_repeated_docstrings(str(question), str(solution))
        for question, solution in zip(frame["question"], frame["solution"], strict=True)
    ]
    return frame.assign(solution=shown)


def load_for_parameters(
    name: str,
    split: Split,
    *,
    options: Any = None,
    code_validation: Any = None,
    seed: int = 0,
) -> pd.DataFrame:
    """`load_dataset` driven by DatasetParameters-like `options` (max_train_size, max_test_size,
    reduce_shuffle_seed, local_path, difficulty, solution_docstring) and
    CodeValidationParameters-like `code_validation` (apps_difficulty, apps_exclude_flagged); None
    means the defaults."""
    size_field = "max_train_size" if split == "train" else "max_test_size"
    return load_dataset(
        name,
        split,
        path=getattr(options, "local_path", None),
        max_size=getattr(options, size_field, None),
        shuffle_seed=getattr(options, "reduce_shuffle_seed", 42),
        seed=seed,
        difficulty=getattr(code_validation, "apps_difficulty", "interview"),
        exclude_flagged=getattr(code_validation, "apps_exclude_flagged", True),
        bug_difficulty=getattr(options, "difficulty", DEFAULT_DIFFICULTY),
        solution_docstring=getattr(options, "solution_docstring", DEFAULT_SOLUTION_DOCSTRING),
    )


def humaneval_file() -> Path:
    """Location of the shipped humaneval-buggy Parquet file (package data)."""
    return Path(str(importlib.resources.files("nip_core.data") / HUMANEVAL_FILE))


def humaneval_buggy_split(
    split: Split, path: str | Path | None = None, difficulty: str = DEFAULT_DIFFICULTY
) -> pd.DataFrame:
    """The rows of one split of humaneval-buggy for one bug difficulty grade, sorted by id.

    The file holds one correct row per problem (`difficulty` null) and one buggy row per
    (problem, grade); a grade keeps its buggy rows and the correct rows of the same problems, so
    every kept problem has exactly one of each. A file without a `difficulty` column (built
    before the grades existed) holds only the default grade.
    """
    check_difficulty(difficulty)
    source = Path(path) if path is not None else humaneval_file()
    frame = read_parquet_frame(source, HUMANEVAL_COLUMNS)
    unexpected = sorted(set(frame["split"]) - set(SPLITS))
    if unexpected:
        raise ValueError(f"dataset file {source} has unknown split values {unexpected}")
    if "difficulty" in frame.columns:
        buggy = frame["difficulty"] == difficulty
        problems = frame.loc[buggy, "problem_id"]
        correct = frame["difficulty"].isna() & frame["problem_id"].isin(problems)
        frame = frame[buggy | correct]
    elif difficulty != DEFAULT_DIFFICULTY:
        raise ValueError(
            f"dataset file {source} has no 'difficulty' column, so {OPTION} must be "
            f"{DEFAULT_DIFFICULTY!r}, got {difficulty!r}"
        )
    rows = frame[frame["split"] == split].sort_values("id", kind="stable")
    return rows.reset_index(drop=True)


def synthetic_test_split(split: Split, seed: int = 0) -> pd.DataFrame:
    """Ten rows "Question i"/"Solution i", stance 1, random labels fixed by (seed, split)."""
    rng = random.Random(stable_seed(seed, "test-dataset", split))
    records = [
        {
            "id": i,
            "question": f"Question {i}",
            "solution": f"Solution {i}",
            "y": rng.randint(0, 1),
            "prover_stance": 1,
        }
        for i in range(TEST_DATASET_SIZE)
    ]
    return pd.DataFrame.from_records(records, columns=list(DATAPOINT_COLUMNS))


def reduced(frame: pd.DataFrame, max_size: int | None, shuffle_seed: int = 42) -> pd.DataFrame:
    """At most `max_size` rows, picked (in sample order) by `random.Random(shuffle_seed)`."""
    if max_size is None or max_size >= len(frame):
        return frame
    positions = random.Random(shuffle_seed).sample(range(len(frame)), max_size)
    return frame.iloc[positions].reset_index(drop=True)


def datapoints(frame: pd.DataFrame) -> list[Datapoint]:
    """The rows of a loaded dataset as `Datapoint` records (plain Python ints and strings)."""
    missing = [column for column in DATAPOINT_COLUMNS if column not in frame.columns]
    if missing:
        raise ValueError(f"dataset frame lacks required columns {missing}")
    columns = [frame[column].tolist() for column in DATAPOINT_COLUMNS]
    others = (
        [None if pd.isna(o) else str(o) for o in frame["other_solution"]]
        if "other_solution" in frame.columns
        else [None] * len(frame)
    )
    return [
        Datapoint(
            id=int(i),
            question=str(q),
            solution=str(s),
            y=int(y),
            prover_stance=int(p),
            other_solution=o,
        )
        for i, q, s, y, p, o in zip(*columns, others, strict=True)
    ]
