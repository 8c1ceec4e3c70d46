"""Code-validation datasets: loading, the offline humaneval-buggy build, and the code sandbox.

Public entry points: `load_dataset`, `load_for_parameters`, `datapoints`, `run_candidate`.
"""

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
    "ExecutionResult",
    "datapoints",
    "humaneval_file",
    "load_dataset",
    "load_for_parameters",
    "prover_stance",
    "run_candidate",
    "run_candidates",
]
