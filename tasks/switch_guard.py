"""Tasks `switch-guard` and `score-previous-models`: `nip_core.training.switch_guard_stage`.

`switch-guard` scores the fine-tuned models against the previous ones on validation episodes and
keeps the previous model where the new one is worse, drifts or always gives one verdict; returns
the models the next iteration uses (kept in the manifest as `models_after`).
`score-previous-models` plays the guard's scoring of the previous models ahead of it, beside the
rollouts, so the guard replays it from its call journal.
"""

from __future__ import annotations

from prefect import task

from nip_core.training.switch_guard_stage import score_previous_models, switch_models
from tasks import TRANSIENT_RETRY

switch_guard_task = task(switch_models, name="switch-guard", **TRANSIENT_RETRY)

# No retries: where it fails, the guard plays what its journal lacks itself.
score_previous_models_task = task(score_previous_models, name="score-previous-models")
