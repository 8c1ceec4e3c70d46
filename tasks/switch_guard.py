"""Task `switch-guard`: `nip_core.training.switch_guard_stage.switch_models`.

Scores the fine-tuned models against the previous ones on validation episodes and keeps the
previous model where the new one is worse, drifts or always gives one verdict; returns the models
the next iteration uses (kept in the manifest as `models_after`).
"""

from __future__ import annotations

from prefect import task

from nip_core.training.switch_guard_stage import switch_models
from tasks import TRANSIENT_RETRY

switch_guard_task = task(switch_models, name="switch-guard", **TRANSIENT_RETRY)
