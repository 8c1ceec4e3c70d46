"""Tasks `evaluate` and `evaluate-shard`: `nip_core.play.evaluation_stage`'s `evaluate` (with a
progress bar and Prefect progress artifact) and `evaluate_shard`.

Model calls touch the network: a transient failure retries the stage, and the call journal
replays every call that had finished, so none is paid for twice.
"""

from __future__ import annotations

from prefect import task

from nip_core.malt.evaluation import file_stem
from nip_core.play.evaluation_stage import Evaluation, evaluate, evaluate_shard
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_context import IterationContext
from tasks import TRANSIENT_RETRY
from tasks.prefect_ui import rollout_progress


@task(name="evaluate", **TRANSIENT_RETRY)
def evaluate_task(
    paths: RunPaths,
    context: IterationContext,
    split: str = "test",
    shard_files: list[str] | None = None,
) -> Evaluation:
    """The evaluation's metrics and the episodes file it wrote."""
    with rollout_progress(
        context, what=f"{split} evaluation", artifact_name=file_stem(split)
    ) as progress:
        return evaluate(paths, context, split, progress, shard_files)


# One shard of the evaluation's episodes wherever the task runner puts it; its nodes file.
evaluate_shard_task = task(
    evaluate_shard,
    name="evaluate-shard",
    task_run_name="evaluate-shard-{shard_index}",
    **TRANSIENT_RETRY,
)
