"""Progress of tree generation: a rich bar on the terminal and a Prefect progress artifact.

    with rollout_progress(context) as progress:
        grow_all_trees(paths, context, progress=progress)

`grow_trees` calls `progress(round, calls_done, calls_in_level)` after every model call, once per
shard and level (shards grow concurrently, so calls of several levels interleave). The total
number of calls is not known in advance (episodes end early), so the bar shows calls done out
of the calls known so far, plus calls per second. Inside a Prefect flow or task run the same
numbers go to a progress artifact, updated at most `min_interval` apart; outside Prefect, and
if the API refuses, that part is a no-op: progress never fails a run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from nip_core.iteration_context import IterationContext
from tasks.prefect_artifacts import artifact_key, in_prefect_run

log = logging.getLogger(__name__)


class ProgressArtifact:
    """A Prefect progress artifact created on first use; errors disable it with a warning."""

    def __init__(self, key: str, description: str) -> None:
        self.key, self.description = key, description
        self.artifact_id: Any = None
        self.enabled = in_prefect_run()

    def set(self, percent: float, description: str) -> None:
        if not self.enabled:
            return
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        percent = round(min(max(percent, 0.0), 100.0), 1)
        try:  # _sync: the callback runs inside the rollouts' event loop but must not be awaited
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


class RolloutProgress:
    """The `grow_trees` progress callback: counts calls and drives the bar and the artifact."""

    def __init__(
        self,
        label: str,
        *,
        rounds: int,
        artifact: ProgressArtifact | None = None,
        console: Console | None = None,
        min_interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.rounds = label, max(rounds, 1)
        self.artifact, self.console = artifact, console
        self.min_interval, self.clock = min_interval, clock
        self.calls_done = self.calls_known = 0
        self.round = 0
        self.percent = 0.0
        self.started: float | None = None
        self.last_publish = float("-inf")
        self.bar: Progress | None = None
        self.bar_task: Any = None
        self.last_refresh = float("-inf")

    def __call__(self, round_: int, calls_done: int, calls_in_level: int) -> None:
        if self.started is None:
            self.started = self.clock()
            self._start_bar()
        if calls_done == 1:  # the first finished call of a (shard, level) reveals its size
            self.calls_known += calls_in_level
        self.calls_done += 1
        self.round = max(self.round, round_)
        level_share = calls_done / calls_in_level if calls_in_level else 1.0
        self.percent = max(self.percent, min(99.0, 100.0 * (round_ + level_share) / self.rounds))
        now = self.clock()
        self._update_bar(now)
        if now - self.last_publish >= self.min_interval:
            self.last_publish = now
            if self.artifact is not None:
                self.artifact.set(self.percent, self.status())

    def calls_per_second(self) -> float:
        elapsed = self.clock() - self.started if self.started is not None else 0.0
        return self.calls_done / elapsed if elapsed > 0 else 0.0

    def status(self) -> str:
        return (
            f"{self.label}: round {self.round + 1}/{self.rounds}, "
            f"{self.calls_done}/{self.calls_known} calls known so far, "
            f"{self.calls_per_second():.1f} calls/s"
        )

    def close(self, finished: bool = True) -> None:
        """Final update (100% when `finished`) and stop the terminal bar."""
        if self.started is None:
            return  # nothing was generated (stage already done): nothing to show
        if finished:
            self.percent = 100.0
        if self.artifact is not None:
            self.artifact.set(self.percent, self.status() + ("" if finished else " (stopped)"))
        self._update_bar(self.clock(), force=True)
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def _start_bar(self) -> None:
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("calls, {task.fields[rate]:.1f} calls/s"),
            TimeElapsedColumn(),
            console=self.console,
            auto_refresh=False,
        )
        self.bar_task = self.bar.add_task(self.label, total=None, rate=0.0)
        self.bar.start()

    def _update_bar(self, now: float, force: bool = False) -> None:
        """Redraw at most 10 times a second: thousands of calls per second are possible."""
        if self.bar is None or (not force and now - self.last_refresh < 0.1):
            return
        self.last_refresh = now
        self.bar.update(
            self.bar_task,
            completed=self.calls_done,
            total=self.calls_known,
            rate=self.calls_per_second(),
            description=f"{self.label} (round {self.round + 1}/{self.rounds})",
        )
        self.bar.refresh()


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
