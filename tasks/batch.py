"""Task `select-batch`: `nip_core.malt.batch_stage.write_batch` (returns the batch file)."""

from __future__ import annotations

from prefect import task

from nip_core.malt.batch_stage import write_batch

select_batch_task = task(write_batch, name="select-batch")
