"""Stage: an experiment's outputs (`nip_core.experiment.seed_outputs`), as a Prefect task.

The rest of an experiment (arms, evaluations, verdict scores, seed files and timings) is
`nip_core.experiment.arm_results` and `seed_outputs`, driven by `flows.experiment`.
"""

from __future__ import annotations

import pandas as pd
from prefect import task

from nip_core.experiment import seed_outputs
from nip_core.run.artifacts import RunPaths


@task(name="experiment-outputs")
def write_outputs_task(
    experiment_paths: RunPaths,
    frames: list[pd.DataFrame],
    timings: pd.DataFrame,
    training: pd.DataFrame,
    *,
    resamples: int,
    seed: int,
    title: str,
) -> pd.DataFrame:
    """experiment.parquet, summary.parquet, experiment.png and experiment.html; the summary."""
    return seed_outputs.write_outputs(
        experiment_paths, frames, timings, training, resamples=resamples, seed=seed, title=title
    )
