"""Progress of tree generation: a rich bar on the terminal, and an optional sink (a Prefect
progress artifact, see `tasks.prefect_ui.rollout_progress`).

`grow_trees` calls `progress(round, issued, 0)` when a node sends its calls of a round and
`progress(round, 0, 1)` when one of them is answered (nodes of every round and shard
interleave). The total number of calls is not known in advance (episodes end early), so the bar
shows calls done out of the calls known so far, plus calls per second. The sink is updated at
most `min_interval` apart; progress never fails a run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class ProgressSink(Protocol):
    def set(self, percent: float, description: str) -> None: ...

    def close(self) -> None:
        """Deliver the last value set; called once, when the generation ends."""


class RolloutProgress:
    """The `grow_trees` progress callback: counts calls and drives the bar and the artifact."""

    def __init__(
        self,
        label: str,
        *,
        rounds: int,
        artifact: ProgressSink | None = None,
        console: Console | None = None,
        min_interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.rounds = label, max(rounds, 1)
        self.artifact, self.console = artifact, console
        self.min_interval, self.clock = min_interval, clock
        self.calls_done = self.calls_known = 0
        self.issued_by_round: dict[int, int] = {}
        self.done_by_round: dict[int, int] = {}
        self.round = 0
        self.percent = 0.0
        self.started: float | None = None
        self.last_publish = float("-inf")
        self.bar: Progress | None = None
        self.bar_task: Any = None
        self.last_refresh = float("-inf")

    def __call__(self, round_: int, issued: int, finished: int) -> None:
        self.issued_by_round[round_] = self.issued_by_round.get(round_, 0) + issued
        self.calls_known += issued
        if not finished:
            return
        if self.started is None:
            self.started = self.clock()
            self._start_bar()
        self.done_by_round[round_] = self.done_by_round.get(round_, 0) + finished
        self.calls_done += finished
        self.round = max(self.round, round_)
        shares = (self.done_by_round.get(r, 0) / n for r, n in self.issued_by_round.items() if n)
        self.percent = max(self.percent, min(99.0, 100.0 * sum(shares) / self.rounds))
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
            self.artifact.close()
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
