"""Bug difficulty grades of humaneval-buggy (`dataset_options.difficulty`).

Every grade: balanced labels per split, one correct and one buggy row per problem, the same
split per problem as the default grade, buggy rows that really fail; the default grade is the
original dataset row for row; unknown grades fail clearly.
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import typing
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nip_core.data import (
    DEFAULT_DIFFICULTY,
    DIFFICULTIES,
    humaneval_file,
    load_dataset,
    load_for_parameters,
    run_candidates,
)
from nip_core.data.difficulty import (
    STUB_BODIES,
    check_difficulty,
    mutant_difficulty,
    stub_mutants,
)
from nip_core.data.humaneval import METADATA_PREFIX, problem_split, read_problems, source_path
from nip_core.data.mutants import enumerate_mutants
from nip_core.data.mutations import EXTRA_OPERATORS, OPERATORS, Mutant
from nip_core.parameters.scenario import DatasetParameters

GRADES = ("easy", "medium", "hard")
# The columns and per-split content digests of the dataset before the grades existed.
ORIGINAL_COLUMNS = [
    "id",
    "problem_id",
    "question",
    "solution",
    "y",
    "prover_stance",
    "mutation",
    "split",
]
ORIGINAL_DIGESTS = {
    "train": (252, "79febde816a980562e9cc877acbd8322a3500e5eaf6bc7c55141de9331123589"),
    "test": (72, "263e0033d4a6ae8e8f403df5df80a19240d821e4ced7d974ba7d72b19550e9f0"),
}  # fmt: skip


def _digest(frame: pd.DataFrame) -> str:
    part = frame[ORIGINAL_COLUMNS]
    records = part.astype(object).where(part.notna(), None).to_dict("records")
    return hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()


@pytest.fixture(scope="module")
def graded() -> dict[str, pd.DataFrame]:
    """Both splits of every grade, as the loader returns them, sorted by id."""
    return {
        grade: pd.concat(
            [load_dataset("humaneval-buggy", split, bug_difficulty=grade) for split in ("train", "test")]
        ).sort_values("id", ignore_index=True)
        for grade in DIFFICULTIES
    }  # fmt: skip


@pytest.fixture(scope="module")
def problems() -> dict[str, object]:
    return {problem.task_id: problem for problem in read_problems(source_path())}


@pytest.mark.parametrize("split", ["train", "test"])
def test_default_grade_is_the_original_dataset(split: str) -> None:
    frame = load_dataset("humaneval-buggy", split)
    assert (len(frame), _digest(frame)) == ORIGINAL_DIGESTS[split]
    assert list(frame.columns) == [*ORIGINAL_COLUMNS, "difficulty"]
    assert list(frame.index) == list(range(len(frame)))
    assert set(frame["difficulty"].dropna()) == {"mixed"}
    named = load_dataset("humaneval-buggy", split, bug_difficulty="mixed")
    via_options = load_for_parameters("humaneval-buggy", split, options=DatasetParameters())
    pd.testing.assert_frame_equal(named, frame)
    pd.testing.assert_frame_equal(via_options, frame)


@pytest.mark.parametrize("grade", DIFFICULTIES)
def test_each_grade_is_balanced_and_split_by_problem_like_the_default(
    grade: str, graded: dict[str, pd.DataFrame]
) -> None:
    frame = graded[grade]
    for split in ("train", "test"):
        part = frame[frame["split"] == split]
        assert len(part) >= 60 and part["y"].mean() == 0.5
    per_problem = frame.groupby("problem_id")["y"].agg(["count", "sum"])
    assert (per_problem["count"] == 2).all() and (per_problem["sum"] == 1).all()
    assert len(per_problem) >= 150
    splits = frame.groupby("problem_id")["split"].agg(set)
    assert (splits.str.len() == 1).all()
    for problem_id, (split,) in splits.items():
        assert split == problem_split(problem_id, 0)
    default = graded[DEFAULT_DIFFICULTY].drop_duplicates("problem_id").set_index("problem_id")
    common = splits.index.intersection(default.index)
    assert len(common) >= 150
    assert [next(iter(s)) for s in splits[common]] == default.loc[common, "split"].tolist()
    buggy, correct = frame[frame["y"] == 0], frame[frame["y"] == 1]
    assert (buggy["difficulty"] == grade).all() and correct["difficulty"].isna().all()
    assert frame["id"].is_unique and frame["id"].is_monotonic_increasing


def test_correct_rows_are_shared_and_buggy_rows_differ_by_grade(
    graded: dict[str, pd.DataFrame],
) -> None:
    correct = pd.concat(frame[frame["y"] == 1] for frame in graded.values())
    assert (correct.groupby("id")["solution"].nunique() == 1).all()
    buggy = {
        grade: frame[frame["y"] == 0].set_index("problem_id") for grade, frame in graded.items()
    }
    common = buggy["easy"].index.intersection(buggy["medium"].index)
    assert (buggy["easy"].loc[common, "solution"] != buggy["medium"].loc[common, "solution"]).all()


def test_metadata_counts_match_the_loaded_grades(graded: dict[str, pd.DataFrame]) -> None:
    meta = pq.read_table(humaneval_file()).schema.metadata
    counts = json.loads(meta[(METADATA_PREFIX + "counts").encode()])["difficulties"]
    for grade, frame in graded.items():
        problems = frame.drop_duplicates("problem_id")["split"].value_counts()
        expected = {
            "train": counts[grade]["problems_train"],
            "test": counts[grade]["problems_test"],
        }
        assert problems.to_dict() == expected
        assert counts[grade]["problems"] == len(frame) // 2
    grading = json.loads(meta[(METADATA_PREFIX + "difficulty").encode()])
    assert grading["grades"] == list(DIFFICULTIES) and grading["default"] == DEFAULT_DIFFICULTY


def test_easy_rows_are_stubs_of_the_prompt(graded: dict[str, pd.DataFrame], problems: dict) -> None:
    for row in graded["easy"][graded["easy"]["y"] == 0].itertuples():
        problem = problems[row.problem_id]
        body = row.solution[len(problem.prompt) :].strip()
        assert row.solution.startswith(problem.prompt) and body in STUB_BODIES
        assert row.mutation == f"stub: body replaced by '{body}'"
        function = ast.parse(row.solution).body[-1]
        assert isinstance(function, ast.FunctionDef) and function.name == problem.entry_point


def _jobs(rows: pd.DataFrame, problems: dict) -> list[tuple[str, str, str]]:
    return [
        (row.solution, problems[row.problem_id].test, problems[row.problem_id].entry_point)
        for row in rows.itertuples()
    ]


def test_sampled_buggy_rows_fail_and_canonicals_pass(
    graded: dict[str, pd.DataFrame], problems: dict
) -> None:
    """A seeded sample of every grade run in the sandbox (the data file is fixed: running all
    164 easy rows took about 40 s of every suite run; every easy row is still checked to be a
    stub of its prompt by `test_easy_rows_are_stubs_of_the_prompt`)."""
    rng = random.Random(17)
    easy = graded["easy"]
    rows = [easy.loc[sorted(rng.sample(list(easy.index), 40))]]  # buggy and correct
    for grade in ("medium", "hard", "mixed"):
        buggy = graded[grade][graded[grade]["y"] == 0]
        rows.append(buggy.loc[sorted(rng.sample(list(buggy.index), 10))])
    rows = pd.concat(rows, ignore_index=True)
    results = run_candidates(_jobs(rows, problems), timeout=10)
    for row, result in zip(rows.itertuples(), results, strict=True):
        assert result.passed == (row.y == 1), (row.id, row.mutation, result.reason)
        if row.difficulty in GRADES:  # graded bugs fail by an error, not a limit
            assert not result.hit_limit, (row.id, result.reason)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "humaneval-buggy", "bug_difficulty": "trivial"}, r"dataset_options\.difficulty must be one of \('mixed', 'easy', 'medium', 'hard'\).*'trivial'"),
        ({"name": "humaneval-buggy", "bug_difficulty": None}, r"dataset_options\.difficulty must be one of"),
        ({"name": "test", "bug_difficulty": "trivial"}, r"dataset_options\.difficulty must be one of"),
        ({"name": "test", "bug_difficulty": "easy"}, r"dataset_options\.difficulty='easy' needs dataset 'humaneval-buggy'"),
        ({"name": "buggy-apps", "bug_difficulty": "hard", "path": "/no/such/dir"}, r"needs dataset 'humaneval-buggy'"),
    ],
)  # fmt: skip
def test_unknown_or_unsupported_grade_raises_a_clear_error(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_dataset(split="train", **kwargs)


def test_option_is_validated_and_passed_through_the_parameters() -> None:
    allowed = typing.get_args(typing.get_type_hints(DatasetParameters)["difficulty"])
    assert allowed == DIFFICULTIES and DatasetParameters().difficulty == DEFAULT_DIFFICULTY
    with pytest.raises(ValueError, match=r"DatasetParameters\.difficulty: 'trivial' is not one of"):
        DatasetParameters(difficulty="trivial")
    with pytest.raises(ValueError, match=r"dataset_options\.difficulty must be one of"):
        load_for_parameters("humaneval-buggy", "test", options=SimpleNamespace(difficulty="x"))
    options = DatasetParameters(difficulty="hard", max_test_size=5, reduce_shuffle_seed=3)
    frame = load_for_parameters("humaneval-buggy", "test", options=options)
    full = load_dataset("humaneval-buggy", "test", bug_difficulty="hard")
    positions = random.Random(3).sample(range(len(full)), 5)
    assert frame["id"].tolist() == full["id"].iloc[positions].tolist()
    assert check_difficulty("easy") == "easy"


def test_file_without_difficulty_column_is_the_default_grade_only(tmp_path: Path) -> None:
    path = tmp_path / "old.parquet"
    frames = [load_dataset("humaneval-buggy", split) for split in ("train", "test")]
    old = pd.concat(frames).sort_values("id").drop(columns=["difficulty"])
    pq.write_table(pa.Table.from_pandas(old, preserve_index=False), path)
    frame = load_dataset("humaneval-buggy", "test", path=str(path))
    assert (len(frame), _digest(frame)) == ORIGINAL_DIGESTS["test"]
    assert "difficulty" not in frame.columns
    with pytest.raises(ValueError, match=r"no 'difficulty' column.*'easy'"):
        load_dataset("humaneval-buggy", "test", path=str(path), bug_difficulty="easy")


PROMPT = '''def total(values: list) -> int:
    """Sum of the values."""
'''
BODY = """    result = 0
    for value in values:
        result += value
    return result
"""


def test_stub_mutants_replace_the_body_after_the_docstring() -> None:
    stubs = stub_mutants(PROMPT, "total")
    assert [m.source for m in stubs] == [PROMPT + f"    {body}\n" for body in STUB_BODIES]
    assert {mutant_difficulty(m) for m in stubs} == {"easy"}
    with pytest.raises(ValueError, match="'other'"):
        stub_mutants(PROMPT, "other")


def test_dropped_statement_never_empties_a_body_and_grades_are_as_documented() -> None:
    source = PROMPT + BODY + "\n\ndef one():\n    '''Doc.'''\n    return 1\n"
    first = PROMPT.count("\n") + 1
    extra = enumerate_mutants(source, first, EXTRA_OPERATORS)
    assert sorted(m.description for m in extra) == [
        "dropped statement: removed a for loop at line 4",
        "dropped statement: removed a return statement at line 6",
        "dropped statement: removed an assignment at line 3",
    ]  # not 'return 1', the only statement of one() besides its docstring
    assert all(m.operator == "dropped_statement" for m in extra)
    assert [m.operator for m in enumerate_mutants(source, first)] == [
        m.operator for m in enumerate_mutants(source, first, OPERATORS)
    ]
    cases = {
        ("compare", "compare: '<' -> '<=' at line 3"): "hard",
        ("compare", "compare: '==' -> '!=' at line 3"): "medium",
        ("constant", "constant: 1 -> 2 at line 3"): "hard",
        ("constant", "constant: True -> False at line 3"): "medium",
        ("wrong_function", "wrong function: 'min' -> 'max' at line 3"): "medium",
        ("wrong_function", "wrong function: 'strip' -> 'lstrip' at line 3"): "hard",
        ("arithmetic", "arithmetic: '+' -> '-' at line 3"): "medium",
        ("dropped_statement", "dropped statement: removed a for loop at line 4"): "medium",
        ("off_by_one", "off-by-one: index +1 at line 3"): "hard",
        ("swapped", "swap: arguments 1 and 2 of a call at line 3"): "hard",
        ("stub", "stub: body replaced by 'pass'"): "easy",
        ("unknown", "something"): None,
    }
    for (operator, description), grade in cases.items():
        assert mutant_difficulty(Mutant("", description, operator)) == grade, description
