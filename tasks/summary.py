"""Task `summarise-iteration`: `nip_core.malt.summary_stage.summarise_iteration` (nodes,
rewards and pairs files in, the iteration's statistics out)."""

from __future__ import annotations

from prefect import task

from nip_core.malt.summary_stage import summarise_iteration

summarise_iteration_task = task(summarise_iteration, name="summarise-iteration")
