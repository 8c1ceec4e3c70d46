"""Stages: fine-tune every trainable group on its dataset, then switch agents to the new models.

What a job trains on and from which model, and how jobs are re-attached or resubmitted:
`nip_core.training.fine_tune_stage`.
"""

from __future__ import annotations

import asyncio

from prefect import task

from nip_core.run.artifacts import RunPaths, read_bytes, sha256_bytes
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import fine_tune_record, fine_tune_steps
from nip_core.run.stages import run_stage
from nip_core.training.fine_tune_stage import submit_and_wait, switch_groups
from tasks import TRANSIENT_RETRY


def fine_tune(paths: RunPaths, context: IterationContext) -> dict:
    def digest(name: str) -> str:
        return sha256_bytes(read_bytes(paths.fs, paths.iteration_file(context.iteration, name)))

    def compute():
        info = asyncio.run(submit_and_wait(paths, context))
        files = {fine_tune_record(g): digest(fine_tune_record(g)) for g in info}
        steps = [fine_tune_steps(g) for g in info]  # jobs that reported steps only
        steps = [s for s in steps if paths.fs.exists(paths.iteration_file(context.iteration, s))]
        return files | {name: digest(name) for name in steps}, info

    return run_stage(paths, context, "fine_tune", compute)


def switch_to_fine_tuned(paths: RunPaths, context: IterationContext) -> dict[str, str]:
    """The model each group would use from the next iteration on: its fine-tuned model (the
    switch guard, a stage of its own, may still keep the previous one)."""

    def compute():
        return {}, {"models_after": asyncio.run(switch_groups(paths, context))}

    return run_stage(paths, context, "switch_model", compute)["info"]["models_after"]


@task(name="fine-tune", **TRANSIENT_RETRY)
def fine_tune_task(paths: RunPaths, context: IterationContext) -> dict:
    return fine_tune(paths, context)["info"]


@task(name="switch-model", **{**TRANSIENT_RETRY, "retry_delay_seconds": [5, 30]})
def switch_model_task(paths: RunPaths, context: IterationContext) -> dict[str, str]:
    return switch_to_fine_tuned(paths, context)
