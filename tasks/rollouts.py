"""Stage: grow the response trees (`nip_core.play.rollout_stage`), as Prefect tasks.

`generate_rollouts_task` grows every shard in one process; `grow_shard_task` grows one shard
wherever a distributed task runner (Dask, Ray) puts it, and the flow records it.
"""

from __future__ import annotations

from prefect import task

from nip_core.play.rollout_stage import grow_all_trees, grow_shard
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import NODES_FILE
from tasks import TRANSIENT_RETRY
from tasks.prefect_artifacts import rollout_progress


# Model calls touch the network: a transient failure retries the stage, which resumes from the
# finished shards and the call journal, so no completed call is paid for twice.
@task(
    name="generate-rollouts",
    **TRANSIENT_RETRY,
)
def generate_rollouts_task(paths: RunPaths, context: IterationContext) -> str:
    with rollout_progress(context) as progress:
        grow_all_trees(paths, context, progress=progress)
    return paths.iteration_file(context.iteration, NODES_FILE)


@task(name="grow-shard", task_run_name="grow-shard-{shard_index}", **TRANSIENT_RETRY)
def grow_shard_task(paths: RunPaths, context: IterationContext, shard_index: int) -> dict:
    """Grow one shard's trees; returns its stage and files (the flow records them)."""
    return grow_shard(paths, context, shard_index)
