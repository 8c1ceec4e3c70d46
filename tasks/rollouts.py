"""Stage: grow the response trees (`nip_core.play.rollout_stage`), as Prefect tasks.

`generate_rollouts_task` grows every shard in one process; `grow_shard_task` grows one shard
wherever a distributed task runner (Dask, Ray) puts it, and the flow records it.
"""

from __future__ import annotations

from prefect import task

from nip_core.play.rollout_stage import grow_all_trees, grow_shard
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_context import IterationContext
from tasks import TRANSIENT_RETRY
from tasks.prefect_ui import rollout_progress


# Model calls touch the network: a transient failure retries the stage, which resumes from the
# finished shards and the call journal, so no completed call is paid for twice.
@task(name="generate-rollouts", **TRANSIENT_RETRY)
def generate_rollouts_task(paths: RunPaths, context: IterationContext, batch: str) -> str:
    """The nodes file."""
    with rollout_progress(context) as progress:
        return grow_all_trees(paths, context, batch, progress=progress)


# One shard's trees wherever a distributed task runner puts it; the flow records what it returns.
grow_shard_task = task(
    grow_shard, name="grow-shard", task_run_name="grow-shard-{shard_index}", **TRANSIENT_RETRY
)
