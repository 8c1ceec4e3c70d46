"""Code-validation datasets: loading, the offline humaneval-buggy build, and the code sandbox.

Public entry points: `load_dataset`, `load_for_parameters`, `datapoints`, `run_candidate`;
`DIFFICULTIES` are the bug difficulty grades of humaneval-buggy (`dataset_options.difficulty`).
"""

from nip_core.data.difficulty import DEFAULT_DIFFICULTY, DIFFICULTIES
from nip_core.data.loaders import (
    DATASET_NAMES,
    datapoints,
    humaneval_file,
    load_dataset,
    load_for_parameters,
)
from nip_core.data.sandbox import ExecutionResult, run_candidate, run_candidates
from nip_core.data.stable import prover_stance

__all__ = [
    "DATASET_NAMES",
    "DEFAULT_DIFFICULTY",
    "DIFFICULTIES",
    "ExecutionResult",
    "datapoints",
    "humaneval_file",
    "load_dataset",
    "load_for_parameters",
    "prover_stance",
    "run_candidate",
    "run_candidates",
]
