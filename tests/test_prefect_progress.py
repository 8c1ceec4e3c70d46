"""Rollout progress: call counting across interleaved shards, throttling, terminal bar, artifact.

pytest tests/test_prefect_progress.py
"""

import asyncio
import io

from prefect import flow
from prefect.artifacts import Artifact
from rich.console import Console

from nip_core.report.progress import RolloutProgress
from tasks.prefect_ui import ProgressArtifact


class FakeClock:
    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class RecordingArtifact:
    def __init__(self) -> None:
        self.updates: list[tuple[float, str]] = []

    def set(self, percent: float, description: str) -> None:
        self.updates.append((percent, description))

    def close(self) -> None:
        self.closed = True


def two_shards_two_rounds() -> list[tuple[int, int, int]]:
    """(round, issued, finished) as grow_trees reports them: shard A sends 2 calls in round 0,
    then 4 once they are answered; shard B 3, then 1; interleaved as asyncio would."""
    return [
        (0, 2, 0),
        (0, 3, 0),
        *[(0, 0, 1)] * 4,  # A's two and two of B's
        (1, 4, 0),  # A's round 0 is answered: its round 1 leaves
        (1, 0, 1),
        (0, 0, 1),  # B's last round-0 call
        (1, 1, 0),
        *[(1, 0, 1)] * 4,
    ]


def test_counts_calls_and_known_total_across_interleaved_shards():
    artifact = RecordingArtifact()
    reporter = RolloutProgress(
        "it 0", rounds=2, artifact=artifact, console=Console(file=io.StringIO()), min_interval=0
    )
    seen_known, seen_done = [], []
    for event in two_shards_two_rounds():
        reporter(*event)
        seen_known.append(reporter.calls_known)
        seen_done.append(reporter.calls_done)
    assert reporter.calls_done == 10
    assert seen_known == [2, 5, 5, 5, 5, 5, 9, 9, 9, 10, 10, 10, 10, 10]
    assert seen_done == [0, 0, 1, 2, 3, 4, 4, 5, 6, 6, 7, 8, 9, 10]
    percents = [p for p, _ in artifact.updates]
    assert len(percents) == 10  # one update per answered call, none for sent ones
    assert percents == sorted(percents) and max(percents) < 100  # monotonic, not done yet
    assert percents[:4] == [10.0, 20.0, 30.0, 40.0]  # share of each round's known calls done
    assert percents[-1] == 99.0  # every known call answered, the stage not yet closed
    reporter.close()
    assert artifact.updates[-1][0] == 100.0
    assert "10/10 calls known so far" in artifact.updates[-1][1]


def test_artifact_updates_are_throttled():
    artifact = RecordingArtifact()
    clock = FakeClock(step=0.05)  # two clock reads per call: ~0.1 s per call
    reporter = RolloutProgress(
        "it 0",
        rounds=3,
        artifact=artifact,
        console=Console(file=io.StringIO()),
        min_interval=0.5,
        clock=clock,
    )
    reporter(0, 100, 0)
    for _ in range(100):
        reporter(0, 0, 1)
    # 100 calls over ~10 s at <= 2 updates/s: about 20 updates, never one per call.
    assert 10 <= len(artifact.updates) <= 25
    rate = reporter.calls_per_second()
    assert 5 < rate < 20


def test_terminal_bar_shows_calls_and_rate():
    out = io.StringIO()
    reporter = RolloutProgress(
        "iteration 3 rollouts", rounds=2, console=Console(file=out, force_terminal=True, width=120)
    )
    for event in two_shards_two_rounds():
        reporter(*event)
    reporter.close()
    text = out.getvalue()
    assert "iteration 3 rollouts" in text
    assert "10/10" in text and "calls/s" in text


def test_stopped_run_is_not_reported_complete_and_idle_run_shows_nothing():
    artifact = RecordingArtifact()
    reporter = RolloutProgress(
        "x", rounds=4, artifact=artifact, console=Console(file=io.StringIO())
    )
    reporter(0, 8, 0)
    reporter(0, 0, 1)
    reporter.close(finished=False)
    assert artifact.updates[-1][0] < 100 and "stopped" in artifact.updates[-1][1]

    idle_out, idle = io.StringIO(), RecordingArtifact()
    RolloutProgress("y", rounds=4, artifact=idle, console=Console(file=idle_out)).close()
    assert idle.updates == [] and idle_out.getvalue() == ""


def test_progress_artifact_is_a_no_op_outside_prefect():
    artifact = ProgressArtifact("some-run-progress", "desc")
    assert artifact.enabled is False
    artifact.set(50.0, "half")  # no API call, no error
    assert artifact.artifact_id is None


def test_setting_progress_never_waits_for_the_prefect_api(monkeypatch):
    """The rollouts' event loop hands values over; a thread publishes the latest of them."""
    import threading

    artifact = ProgressArtifact("some-run-progress", "desc")
    artifact.enabled = True  # as inside a run
    api_answers, published = threading.Event(), []

    def slow_api(percent: float, description: str) -> None:
        published.append((percent, description, api_answers.wait(timeout=10)))

    monkeypatch.setattr(artifact, "_publish", slow_api)
    for step in range(5):
        artifact.set(10.0 * step, f"step {step}")  # returns while the API has not answered
    api_answers.set()
    artifact.close()
    assert all(answered for _, _, answered in published), "set() waited for the API"
    assert published[-1][:2] == (40.0, "step 4") and len(published) <= 2  # only the latest


def test_progress_artifact_inside_a_flow_from_the_event_loop(prefect_harness):
    """The callback runs inside asyncio (like grow_trees) and still updates the artifact."""

    @flow
    def grow() -> None:
        reporter = RolloutProgress(
            "it 0",
            rounds=2,
            artifact=ProgressArtifact("h1-progress-test-rollouts", "it 0"),
            console=Console(file=io.StringIO()),
            min_interval=0,
        )

        async def calls() -> None:
            for event in two_shards_two_rounds():
                reporter(*event)
                await asyncio.sleep(0)

        asyncio.run(calls())
        assert reporter.artifact.enabled, "artifact updates failed inside the event loop"
        reporter.close()

    grow()
    stored = Artifact.get("h1-progress-test-rollouts")
    assert stored is not None and stored.type == "progress"
    assert float(stored.data) == 100.0
    assert "10/10 calls" in stored.description
