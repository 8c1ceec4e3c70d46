"""Task `export-datasets`: `nip_core.malt.export_stage.export_datasets` (batch, nodes, rewards
and pairs files in; per trainable group its dataset's kind, rows and files out)."""

from __future__ import annotations

from prefect import task

from nip_core.malt.export_stage import export_datasets

export_datasets_task = task(export_datasets, name="export-datasets")
