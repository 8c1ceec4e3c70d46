"""Everything an iteration shows in the Prefect UI: a stats table, a markdown summary, a link to
the run folder, and the progress of tree generation. No stage and no task: the task modules
use these (`tasks.publish_summary`, the progress of `tasks.rollouts` and `tasks.evaluate`).

Keys are stable per run (`<run>-iteration-table`, `<run>-iteration-summary`, `<run>-run-folder`),
so each iteration adds a version and the Artifacts page shows the history of a run. The table
and markdown are built by `nip_core.report.summary_markdown` (pure); publishing is a no-op
outside a flow or task run, so the stages stay callable from plain Python.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from nip_core.report.progress import RolloutProgress
from nip_core.report.summary_markdown import summary_markdown, table_rows
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_context import IterationContext

log = logging.getLogger(__name__)


def artifact_key(run_name: str, suffix: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for this run."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{run_name}-{suffix}".lower()).strip("-")
    return slug or "run"


def in_prefect_run() -> bool:
    """Whether we are inside a Prefect flow or task run (artifacts attach to it)."""
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


class ProgressArtifact:
    """A Prefect progress artifact created on first use; errors disable it with a warning.

    `set` only hands the latest value to a publishing thread of its own: the progress callback
    runs inside the rollouts' event loop, and a synchronous call to the Prefect API there stops
    the loop, and every model call in flight, until the API answers. `close` publishes the last
    value and waits for it.
    """

    def __init__(self, key: str, description: str) -> None:
        self.key, self.description = key, description
        self.artifact_id: Any = None
        self.enabled = in_prefect_run()
        self._latest: tuple[float, str] | None = None
        self._closing = False
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def set(self, percent: float, description: str) -> None:
        if not self.enabled:
            return
        with self._wake:
            self._latest = (round(min(max(percent, 0.0), 100.0), 1), description)
            self._wake.notify()
        if self._thread is None:  # the run's context goes along: the artifact attaches to it
            context = contextvars.copy_context()
            self._thread = threading.Thread(
                target=context.run, args=(self._publish_latest,), name=f"progress-{self.key}"
            )
            self._thread.daemon = True
            self._thread.start()

    def close(self) -> None:
        """Publish the last value handed to `set`, then stop the publishing thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _publish_latest(self) -> None:
        while True:
            with self._wake:
                while self._latest is None and not self._closing:
                    self._wake.wait()
                if self._latest is None:
                    return
                (percent, description), self._latest = self._latest, None
            if self.enabled:
                self._publish(percent, description)

    def _publish(self, percent: float, description: str) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        try:
            if self.artifact_id is None:
                self.artifact_id = create_progress_artifact(
                    percent, key=self.key, description=description, _sync=True
                )
            else:
                update_progress_artifact(
                    self.artifact_id, percent, description=description, _sync=True
                )
        except Exception as e:  # progress is cosmetic: never fail the stage for it
            log.warning("progress artifact %s disabled: %s", self.key, e)
            self.enabled = False


@contextlib.contextmanager
def rollout_progress(
    context: IterationContext,
    console: Console | None = None,
    *,
    what: str = "rollouts",
    artifact_name: str = "rollouts",
) -> Iterator[RolloutProgress]:
    """A progress reporter for one iteration's tree generation (`what`), closed on exit."""
    key = artifact_key(context.run_name, f"iteration-{context.iteration:04d}-{artifact_name}")
    label = f"iteration {context.iteration} {what}"
    reporter = RolloutProgress(
        label,
        rounds=context.protocol.max_message_rounds,
        artifact=ProgressArtifact(key, label),
        console=console,
    )
    finished = False
    try:
        yield reporter
        finished = True
    finally:
        reporter.close(finished)


def run_folder_url(paths: RunPaths) -> str:
    """A link to the run folder: file:// for local paths, the fsspec URL otherwise."""
    if paths.is_local:
        return Path(paths.run_dir).as_uri()
    return paths.fs.unstrip_protocol(paths.run_dir)


def publish_iteration_artifacts(
    paths: RunPaths, context: IterationContext, stats: dict
) -> dict[str, Any]:
    """Create the table, markdown and link artifacts; returns their ids by key ({} outside)."""
    if not in_prefect_run():
        return {}
    from prefect.artifacts import (
        create_link_artifact,
        create_markdown_artifact,
        create_table_artifact,
    )

    run, it = context.run_name, context.iteration
    keys = {
        "table": artifact_key(run, "iteration-table"),
        "summary": artifact_key(run, "iteration-summary"),
        "link": artifact_key(run, "run-folder"),
    }
    return {
        keys["table"]: create_table_artifact(
            table_rows(stats, context.protocol.verifier_name),
            key=keys["table"],
            description=f"{run} iteration {it}: per-agent statistics",
            _sync=True,
        ),
        keys["summary"]: create_markdown_artifact(
            summary_markdown(paths, context, stats),
            key=keys["summary"],
            description=f"{run} iteration {it}: summary",
            _sync=True,
        ),
        keys["link"]: create_link_artifact(
            run_folder_url(paths),
            link_text=paths.run_dir,
            key=keys["link"],
            description=f"{run}: run folder",
            _sync=True,
        ),
    }
