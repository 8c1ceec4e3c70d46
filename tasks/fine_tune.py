"""Tasks `fine-tune` and `switch-model`: `nip_core.training.fine_tune_stage`'s `fine_tune` (the
export's datasets in, each group's job record out) and `switch_to_fine_tuned` (job records in,
each group's fine-tuned model out). Both touch the network, so a transient failure retries them;
a rerun re-attaches to the submitted job instead of submitting another."""

from __future__ import annotations

from prefect import task

from nip_core.training.fine_tune_stage import fine_tune, switch_to_fine_tuned
from tasks import TRANSIENT_RETRY

fine_tune_task = task(fine_tune, name="fine-tune", **TRANSIENT_RETRY)
switch_model_task = task(
    switch_to_fine_tuned, name="switch-model", **{**TRANSIENT_RETRY, "retry_delay_seconds": [5, 30]}
)
