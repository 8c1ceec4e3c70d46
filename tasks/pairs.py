"""Task `select-pairs`: `nip_core.malt.pairs_stage.write_pairs` (nodes and rewards files in,
pairs file out)."""

from __future__ import annotations

from prefect import task

from nip_core.malt.pairs_stage import write_pairs

select_pairs_task = task(write_pairs, name="select-pairs")
