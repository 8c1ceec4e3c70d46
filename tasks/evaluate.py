"""Stage: evaluate the iteration's current models on a held-out split
(`nip_core.play.evaluation_stage`), as Prefect tasks with a progress artifact.
"""

from __future__ import annotations

from prefect import get_run_logger, task

from nip_core.malt.evaluation import file_stem, format_metrics
from nip_core.play.evaluation_stage import evaluate, evaluate_shard
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_context import IterationContext
from tasks import TRANSIENT_RETRY
from tasks.prefect_artifacts import rollout_progress


def evaluation_progress(context: IterationContext, split: str):
    """Terminal bar and Prefect progress artifact of the evaluation's generation."""
    return rollout_progress(context, what=f"{split} evaluation", artifact_name=file_stem(split))


# Model calls touch the network: a transient failure retries the stage, and the call journal
# replays every call that had finished, so none is paid for twice.
@task(
    name="evaluate",
    **TRANSIENT_RETRY,
)
def evaluate_task(
    paths: RunPaths,
    context: IterationContext,
    split: str = "test",
    shard_files: list[str] | None = None,
) -> dict:
    with evaluation_progress(context, split) as progress:
        metrics = evaluate(paths, context, split, progress, shard_files)
    get_run_logger().info("iteration %d %s", context.iteration, format_metrics(metrics))
    return metrics


@task(name="evaluate-shard", task_run_name="evaluate-shard-{shard_index}", **TRANSIENT_RETRY)
def evaluate_shard_task(
    paths: RunPaths, context: IterationContext, split: str, shard_index: int
) -> str:
    """Play one shard of the evaluation's episodes wherever the task runner puts this task;
    returns its nodes file (relative)."""
    return evaluate_shard(paths, context, split, shard_index)
