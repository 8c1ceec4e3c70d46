"""Kill soak: SIGKILL one MALT iteration at random moments, resume it each time, compare.

    python bench/kill_soak.py                       # 20 kills, seed 0, kept under a temp folder
    python bench/kill_soak.py --kills 40 --seed 7 --latency 0.3 --work /tmp/kill-soak

Runs `python -m flows.malt_iteration` on the dummy backend (`NIP_DUMMY_LATENCY` seconds per model
call; 8 datapoints, up to 8 rounds, the switch guard on: about 40 s uninterrupted here) once
without interruption as the reference, then again in another folder under the same run name:
started in a session of its own, killed with `os.killpg(pid, SIGKILL)` (Prefect's temporary API
server goes with it) and restarted, until `--kills` kills have landed, then left to finish.

Where each kill lands is drawn from a seeded RNG, adapting to how far the run got (read from its
folder and timed against the reference's timeline, `bench/soak_timeline.py`): 20 % during
start-up (0.5 s to the shortest start-up seen so far after launch); of the others, 60 % at the
moment the run writes one of its next milestones (a stage's file or manifest entry; drawn among
those whose stage has been hit least so far), plus 0-20 ms, so every stage gets kills, including
those that take milliseconds, and kills land between a stage's files and its manifest entry;
the others a delay u after the restarted run took its lock, u uniform in
[0, max(min(left, 2 x left / kills to go), 3 s)] where `left` is the reference's remaining time
(the 3 s: a restart re-checks its finished stages first), so they spread over generation, the
switch guard and the resume itself. Once a run has finished (a kill that lands after
its last write, while it shuts down, finishes it too), a new run folder is started (another
round) until all kills have landed; every round is compared with the reference.

Prints per kill the stage it hit, then: kills landed, wall times, orphaned processes (tagged
processes alive after a kill), duplicate model calls (a call made again after a kill although
its answer was already in the call journal), duplicate fine-tune jobs (dummy backend: the job
is simulated, `fine_tune/<group>.json` must name one job per trainable group), and per round the
comparison of `bench/soak_compare.py` (differing files, lost, duplicate and extra rows).
Targets: all 0, every restart exits 0 or is killed, the last one exits 0. Last line:
`problems: N`; the exit status is 1 when N > 0.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.soak_compare import (  # noqa: E402
    Comparison,
    compare_runs,
    duplicate_jobs,
    is_journal,
    journal_records,
    recorded_jobs,
)
from bench.soak_procs import iteration_command, kill_group, reap_orphans, soak_env, start  # noqa: E402
from bench.soak_timeline import (  # noqa: E402
    Timeline,
    lock_holder,
    progress,
    record_timeline,
    wait_until,
)

RUN = "soak"
OVERRIDES = [
    "agents._default.use_dummy_api=true",
    "rl.rollouts_per_iteration=8",
    "text_rl.rollout_shard_size=2",
    "nip_protocol.max_message_rounds=8",
]
STARTUP_SHARE, EVENT_SHARE = 0.2, 0.6  # of all kills; of the kills after start-up
# A restart re-checks every finished stage before it writes anything new: however little work
# is left, a delay kill may come up to this long after the run lock.
RESUME_FLOOR = 3.0
RUN_TIMEOUT = 600.0
MAX_CRASHES = 3  # restarts that exit non-zero before a round gives up


@dataclass
class Round:
    """One killed run folder, restarted until it finished."""

    root: Path
    call_log: Path
    kills: list[tuple[int, set[str]]] = field(default_factory=list)  # (call-log lines, journaled)
    crashes: list[str] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.root / RUN

    @property
    def iteration_dir(self) -> Path:
        return self.run_dir / "iterations" / "0000"


@dataclass
class SoakResult:
    kills: int = 0
    where: Counter = field(default_factory=Counter)
    kills_mid_write: int = 0  # kills that left a half-written temporary file behind
    half_written: Counter = field(default_factory=Counter)  # their target names
    orphans: list[str] = field(default_factory=list)
    duplicate_calls: int = 0
    remade_in_flight: int = 0
    duplicate_jobs: int = 0
    crashes: list[str] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    reference_wall: float = 0.0
    reference_calls: int = 0
    reference_repeats: int = 0  # identical calls within the uninterrupted run (expected 0)
    killed_wall: float = 0.0

    @property
    def problems(self) -> int:
        compared = sum(c.problems for c in self.comparisons)
        return (
            len(self.orphans) + self.duplicate_calls + self.duplicate_jobs + len(self.crashes)
        ) + compared


def journaled_keys(iteration_dir: Path) -> set[str]:
    """Keys of every call answer durable in the folder's call journals."""
    keys = set()
    for path in iteration_dir.rglob("*.jsonl"):
        if is_journal(path.relative_to(iteration_dir).as_posix()):
            keys.update(json.loads(r)[0] for r in journal_records(path.read_bytes())[0])
    return keys


def call_log(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def repeated_calls(one: Round) -> tuple[int, int]:
    """(calls made again after a kill whose answer was journaled before it, calls made again
    that were in flight at a kill: made but not yet journaled, legitimately repeated)."""
    calls = call_log(one.call_log)
    duplicates, in_flight = set(), set()
    for before, journaled in one.kills:
        made = set(calls[:before])
        for index in range(before, len(calls)):
            if calls[index] in journaled:
                duplicates.add(index)
            elif calls[index] in made:
                in_flight.add(index)
    return len(duplicates), len(in_flight - duplicates)


class KillSoak:
    """The kill loop; `run()` returns a `SoakResult`."""

    def __init__(
        self, work: Path, *, kills: int, seed: int, latency: float, overrides: list[str],
        env: dict[str, str] | None = None, echo=print,
    ) -> None:  # fmt: skip
        self.work, self.kills_wanted, self.rng = work, kills, random.Random(seed)
        self.overrides, self.echo = overrides, echo
        self.env = soak_env(work, {"NIP_DUMMY_LATENCY": str(latency), **(env or {})})
        self.tag = f"kill-soak-{uuid.uuid4().hex[:8]}"
        self.result = SoakResult()
        self.timeline = Timeline()
        # launch -> run lock of restarts; the reference's first start also sets up Prefect's DB
        self.startups: list[float] = []

    def launch(self, root: Path, call_log_path: Path) -> subprocess.Popen:
        args = [f"--set={o}" for o in self.overrides]
        args += ["--run-name", RUN, "--artifacts-root", str(root), "--no-wandb"]
        env = {**self.env, "NIP_DUMMY_CALL_LOG": str(call_log_path)}
        log = root.parent / f"{root.name}.log"
        with open(log, "a") as out:
            out.write(f"=== start {time.strftime('%H:%M:%S')}, after {self.result.kills} kills\n")
        return start(iteration_command(args), env, log, self.tag)

    def reference(self) -> Round:
        ref = Round(self.work / "reference", self.work / "reference-calls.log")
        process = self.launch(ref.root, ref.call_log)
        try:
            self.timeline = record_timeline(process, ref.run_dir, ref.iteration_dir, RUN_TIMEOUT)
        finally:
            kill_group(process)
        if process.returncode != 0:
            raise RuntimeError(f"the reference run failed ({process.returncode}); see its log")
        self.result.reference_wall = self.timeline.wall
        calls = call_log(ref.call_log)
        self.result.reference_calls, self.result.reference_repeats = (
            len(calls),
            len(calls) - len(set(calls)),
        )
        self.result.orphans += reap_orphans(self.tag)
        return ref

    def aim(self, process: subprocess.Popen, one: Round) -> str:
        """Wait for this attempt's kill moment; returns the kind of moment."""
        now, left_kills = time.monotonic(), max(self.kills_wanted - self.result.kills, 1)
        if self.rng.random() < STARTUP_SHARE:
            startup = min(self.startups, default=self.timeline.startup)
            wait_until(lambda: False, process, now + self.rng.uniform(0.5, startup))
            return "start-up"
        got = self.timeline.reached(progress(one.iteration_dir))
        deadline = now + RUN_TIMEOUT
        upcoming = self.timeline.milestones(after=got)
        if upcoming and self.rng.random() < EVENT_SHARE:
            hits = {e: self.result.where[self.timeline.stage_at(e)] for e in upcoming}
            target = self.rng.choice([e for e in upcoming if hits[e] == min(hits.values())])
            later = self.timeline.at[target]

            def reached() -> bool:
                events = progress(one.iteration_dir)
                return target in events or self.timeline.reached(events) > later

            if wait_until(reached, process, deadline):
                time.sleep(self.rng.uniform(0.0, 0.02))
            return "event"
        left = max(self.timeline.end - got, 0.05)
        u = self.rng.uniform(0.0, max(min(left, 2.0 * left / left_kills), RESUME_FLOOR))
        if wait_until(lambda: lock_holder(one.run_dir) == process.pid, process, deadline):
            self.startups.append(time.monotonic() - now)
            wait_until(lambda: False, process, time.monotonic() + u)
        return "delay"

    def attempt(self, one: Round) -> bool:
        """Start the run and kill it at a drawn moment; True when the run has finished."""
        process = self.launch(one.root, one.call_log)
        try:
            how = self.aim(process, one)
        finally:
            landed = kill_group(process)
        if landed:
            events = progress(one.iteration_dir)
            stage = self.timeline.stage_of(events)
            if how == "start-up" and lock_holder(one.run_dir) != process.pid:
                stage = "start-up"
            one.kills.append((len(call_log(one.call_log)), journaled_keys(one.iteration_dir)))
            half = {p.name.split("-", 2)[-1] for p in one.run_dir.rglob(".tmp-*")}
            self.result.half_written.update(half)
            self.result.kills_mid_write += bool(half)
            self.result.kills += 1
            self.result.where[stage] += 1
            self.echo(f"kill {self.result.kills:3d} ({how:8s}) landed in {stage}")
        elif process.returncode != 0:
            one.crashes.append(f"{one.root.name}: exit {process.returncode}")
            self.echo(f"restart exited with {process.returncode} before its kill ({how})")
        else:
            self.echo(f"run finished before its kill ({how}): round {one.root.name} done")
        self.result.orphans += reap_orphans(self.tag)
        return not landed and process.returncode == 0

    def finish(self, one: Round) -> None:
        process = self.launch(one.root, one.call_log)
        try:
            process.wait(RUN_TIMEOUT)
        finally:
            kill_group(process)
        self.result.orphans += reap_orphans(self.tag)
        if process.returncode != 0:
            one.crashes.append(f"{one.root.name}: final run exit {process.returncode}")

    def run(self) -> SoakResult:
        ref = self.reference()
        began, rounds = time.monotonic(), []
        while self.result.kills < self.kills_wanted:
            one = Round(self.work / f"killed-{len(rounds)}", self.work / f"calls-{len(rounds)}.log")
            rounds.append(one)
            finished = False
            while self.result.kills < self.kills_wanted and not finished:
                if len(one.crashes) >= MAX_CRASHES or "done" in progress(one.iteration_dir):
                    break  # given up, or finished by a kill while it shut down
                finished = self.attempt(one)
            if not finished:
                self.finish(one)
            if len(one.crashes) >= MAX_CRASHES:
                break
        self.result.killed_wall = time.monotonic() - began
        for one in rounds:
            self.settle(ref, one)
        return self.result

    def settle(self, ref: Round, one: Round) -> None:
        self.result.crashes += one.crashes
        duplicates, in_flight = repeated_calls(one)
        self.result.duplicate_calls += duplicates
        self.result.remade_in_flight += in_flight
        self.result.duplicate_jobs += duplicate_jobs(recorded_jobs(one.iteration_dir))
        self.result.comparisons.append(compare_runs(ref.run_dir, one.run_dir))


def report(result: SoakResult, echo=print) -> None:
    where = ", ".join(f"{stage} {n}" for stage, n in result.where.most_common())
    echo(f"kills landed: {result.kills} ({where})")
    half = ", ".join(f"{name} {n}" for name, n in result.half_written.most_common())
    echo(
        f"kills during an atomic write (a .tmp- file left behind): {result.kills_mid_write} {half}"
    )
    echo(
        f"uninterrupted iteration: {result.reference_wall:.1f} s wall, {result.reference_calls} "
        f"model calls ({result.reference_repeats} repeated)"
    )
    echo(f"killed runs: {len(result.comparisons)} round(s), {result.killed_wall:.1f} s wall")
    echo(f"orphaned processes: {len(result.orphans)} {result.orphans or ''}")
    echo(f"crashed restarts: {len(result.crashes)} {result.crashes or ''}")
    echo(
        f"duplicate model calls: {result.duplicate_calls} (in-flight calls made again after a "
        f"kill, expected: {result.remade_in_flight})"
    )
    echo(f"duplicate fine-tune jobs: {result.duplicate_jobs}")
    for n, comparison in enumerate(result.comparisons):
        echo(f"round {n}: {comparison.summary()}")
        for line in comparison.differing:
            echo(f"  {line}")
    echo(f"problems: {result.problems}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.3, help="seconds per model call")
    parser.add_argument("--work", type=Path, help="folder for the runs (default: a temp folder)")
    parser.add_argument("--set", action="append", default=[], help="more overrides")
    args = parser.parse_args(argv)
    echo = functools.partial(print, flush=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="kill-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    echo(f"work folder: {work}")
    began = time.monotonic()
    soak = KillSoak(
        work, kills=args.kills, seed=args.seed, latency=args.latency,
        overrides=OVERRIDES + args.set, echo=echo,
    )  # fmt: skip
    result = soak.run()
    echo(f"soak wall: {time.monotonic() - began:.1f} s")
    report(result, echo)
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
