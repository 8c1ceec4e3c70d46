"""Stage: the switch guard (`nip_core.training.switch_guard_stage`), as a Prefect task.

Scores the fine-tuned models against the previous ones on validation episodes and keeps the
previous model where the new one is worse, drifts or always gives one verdict.
"""

from __future__ import annotations

from prefect import task

from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_context import IterationContext
from nip_core.training.switch_guard_stage import switch_models
from tasks import TRANSIENT_RETRY


@task(name="switch-guard", **TRANSIENT_RETRY)
def switch_guard_task(
    paths: RunPaths, context: IterationContext, candidates: dict[str, str]
) -> dict[str, str]:
    """The models the next iteration uses (kept in the manifest as `models_after`)."""
    return switch_models(paths, context, candidates)
