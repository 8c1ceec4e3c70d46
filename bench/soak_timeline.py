"""How far an iteration got, read from its folder alone, and the reference run's timeline.

The kill soak aims its kills with these: an event is something an iteration writes exactly once
(a stage's file, a manifest stage entry, the n-th line of a call journal, `done` when the
manifest names the models after the iteration), so the events present in a folder measure its
progress, and the reference run's timeline says how long after taking the run lock each event
came, hence how much work is left.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.soak_compare import is_journal

POLL_SECONDS = 0.02
TMP_PREFIX = ".tmp-"


def progress(iteration_dir: Path) -> set[str]:
    """The events present in an iteration folder now (see the module doc)."""
    events: set[str] = set()
    if not iteration_dir.is_dir():
        return events
    for path in iteration_dir.rglob("*"):
        if path.name.startswith(TMP_PREFIX) or not path.is_file():
            continue
        relative = path.relative_to(iteration_dir).as_posix()
        if is_journal(relative):
            try:
                lines = path.read_bytes().count(b"\n")
            except FileNotFoundError:
                continue
            events.update(f"{relative}#{n}" for n in range(1, lines + 1))
        else:
            events.add(relative)
    events.update(manifest_events(iteration_dir / "manifest.json"))
    return events


def manifest_events(path: Path) -> set[str]:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return set()
    events = {f"stage:{name}" for name in manifest.get("stages", {})}
    return events | ({"done"} if manifest.get("models_after") else set())


def lock_holder(run_dir: Path) -> int | None:
    """The pid in the run folder's lock file, if readable."""
    try:
        return int(json.loads((run_dir / ".lock").read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class Timeline:
    """Seconds from taking the run lock to each event of an uninterrupted run."""

    at: dict[str, float] = field(default_factory=dict)
    startup: float = 0.0  # process start -> run lock taken
    wall: float = 0.0  # process start -> exit

    @property
    def end(self) -> float:
        return max(self.at.values(), default=0.0)

    def stage_of(self, events: set[str]) -> str:
        """The stage under way in a folder holding `events` (shards count as `rollouts`)."""
        stages = sorted(
            (t, e) for e, t in self.at.items() if e.startswith("stage:") and "/" not in e
        )
        for _, stage in stages:
            if stage not in events:
                return stage.removeprefix("stage:")
        # every stage recorded: the models the next iteration uses are written last
        return "teardown" if "done" in events else "models_after"

    def stage_at(self, event: str) -> str:
        """The stage under way when the reference wrote `event`."""
        return self.stage_of({e for e, t in self.at.items() if t < self.at[event]})

    def milestones(self, after: float) -> list[str]:
        """The events other than journal lines and `done` that came after `after`, in order."""
        events = sorted((t, e) for e, t in self.at.items() if "#" not in e and e != "done")
        return [e for t, e in events if t > after]

    def reached(self, events: set[str]) -> float:
        """How far (reference seconds) a run holding `events` got."""
        return max((self.at[e] for e in events if e in self.at), default=0.0)


def record_timeline(
    process: subprocess.Popen, run_dir: Path, iteration_dir: Path, timeout: float
) -> Timeline:
    """Watch an uninterrupted run to its end; its exit code is left in `process`."""
    timeline, began = Timeline(), time.monotonic()
    active = None
    deadline = began + timeout
    while process.poll() is None and time.monotonic() < deadline:
        now = time.monotonic()
        if active is None and lock_holder(run_dir) == process.pid:
            active = now
            timeline.startup = now - began
        if active is not None:
            for event in progress(iteration_dir) - timeline.at.keys():
                timeline.at[event] = now - active
        time.sleep(POLL_SECONDS)
    if process.poll() is None:
        process.kill()
        raise TimeoutError(f"the reference run did not end within {timeout} s")
    timeline.wall = time.monotonic() - began
    return timeline


def wait_until(condition: Callable[[], bool], process: subprocess.Popen, deadline: float) -> bool:
    """Poll until `condition()`; False when the process ended or the deadline passed first."""
    while process.poll() is None and time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(POLL_SECONDS)
    return False
