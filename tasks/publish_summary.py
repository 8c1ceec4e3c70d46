"""Task `publish-summary`: the iteration's table, summary and run-folder link as Prefect
artifacts (`tasks.prefect_ui.publish_iteration_artifacts`; their ids by key, {} outside a
Prefect run)."""

from __future__ import annotations

from prefect import task

from tasks.prefect_ui import publish_iteration_artifacts

publish_summary_task = task(publish_iteration_artifacts, name="publish-summary")
