"""Server kill soak: SIGKILL a run's own language-model server inside each stage; the run must
restart it and finish in the same invocation, with the files of an uninterrupted run.

    python bench/server_kill_soak.py                 # 10 kills, one per target, temp folder
    python bench/server_kill_soak.py --kills 20 --work /tmp/server-kill-soak

Runs `python -m flows.malt_iteration` with the default configuration on our server's dummy
engine (`NIP_LM_SERVER_ENGINE=dummy`: the run starts, owns and supervises the server, as with a
real engine) once without interruption as the reference, then once per kill in a fresh folder:
the kill waits for its target's milestone (a stage recorded in the manifest, so the kill lands
in the next stage; a fine-tune job's folder in the server state; the switch guard's first model
call) and SIGKILLs the server process that `/health` names, nothing else.

Per kill it prints the stage hit and checks: the command exits 0 (no rerun), the iteration
manifest records exactly one restart caused by SIGKILL, the iteration's files equal the
reference's (`bench/soak_compare.py`: rows, journals, manifests less stage seconds and restarts),
one fine-tune job per trainable group in the server's state, and no tagged process left
alive once the run has ended (the restarted server stopped with it). Last line `problems: N`;
exit status 1 when N > 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.soak_compare import compare_runs, duplicate_jobs, job_id_map  # noqa: E402
from bench.soak_procs import free_port, iteration_command, reap_orphans, soak_env, start  # noqa: E402
from nip_core.lm_server.launch import server_identity  # noqa: E402

RUN = "soak"
ITERATION = Path("iterations") / "0000"


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


# (the stage a kill aims at, the milestone that starts it), one kill each, in turn
TARGETS: list[tuple[str, Callable[[Path], bool]]] = [
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


def run_command(root: Path, port: int) -> list[str]:
    return iteration_command(
        [
            "--run-name", RUN, "--artifacts-root", str(root), "--no-wandb",
            "--set", f"agents._default.language_model_server_port={port}",
        ]
    )  # fmt: skip


def server_jobs_by_group(run_dir: Path) -> dict[str, list[str]]:
    """Group -> ids of the fine-tune jobs in the run's server state (any status)."""
    jobs: dict[str, list[str]] = {}
    for record in (run_dir / "lm_server" / "jobs").glob("*/job.json"):
        job = json.loads(record.read_text())
        group = (job.get("metadata") or {}).get("nip_group", "?")
        jobs.setdefault(group, []).append(job["id"])
    return jobs


def one_kill(
    work: Path, index: int, target: str, reached, env: dict, reference: Path, port: int
) -> tuple[int, str]:
    """Run once with the server killed at `target`; (problems, one-line report). Every run
    uses the reference's port: the port is part of the configuration (its hash)."""
    root, tag = work / f"kill-{index:02d}", f"server-kill-{index}"
    run_dir = root / RUN
    flow = start(run_command(root, port), env, root / "run.log", tag)
    deadline, killed = time.monotonic() + 300, None
    while killed is None and flow.poll() is None and time.monotonic() < deadline:
        if reached(run_dir):
            identity = server_identity(f"http://127.0.0.1:{port}", timeout=1.0)
            if identity and identity.get("pid"):
                killed = identity["pid"]
                os.kill(killed, signal.SIGKILL)
                break
        time.sleep(0.01)
    try:
        code = flow.wait(timeout=max(deadline - time.monotonic(), 1))
    except Exception:  # noqa: BLE001 - a hung run is a problem to report, not a crash
        flow.kill()
        code = None
    orphans = reap_orphans(tag)
    problems, notes = 0, []
    if killed is None:
        return 1, f"{target}: the kill never landed (exit {code})"
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
    comparison = compare_runs(
        reference / ITERATION,
        run_dir / ITERATION,
        job_id_map(reference / ITERATION, run_dir / ITERATION),
    )
    problems += comparison.problems
    duplicates = duplicate_jobs(server_jobs_by_group(run_dir))
    problems += duplicates + len(orphans)
    notes += [comparison.summary(), f"duplicate jobs {duplicates}", f"orphans {len(orphans)}"]
    if comparison.differing:
        notes.append("differing: " + "; ".join(comparison.differing[:5]))
    away = restarts[0].get("answered_after_seconds") if restarts else None
    return problems, f"{target}: exit {code}, server back after {away} s; " + ", ".join(notes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=len(TARGETS))
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="server-kill-soak-"))
    env = soak_env(work, {"NIP_LM_SERVER_ENGINE": "dummy"})
    env.pop("NIP_LM_SERVER_URL", None)
    reference_root = work / "reference"
    started, port = time.monotonic(), free_port()
    flow = start(run_command(reference_root, port), env, reference_root / "run.log", "ref")
    if flow.wait() != 0:
        print(f"the reference run failed: see {reference_root / 'run.log'}")
        return 1
    print(f"reference: {time.monotonic() - started:.0f} s, {work}")
    total = 0
    for index in range(args.kills):
        target, reached = TARGETS[index % len(TARGETS)]
        problems, report = one_kill(work, index, target, reached, env, reference_root / RUN, port)
        total += problems
        print(f"kill {index + 1}: {report}", flush=True)
    print(f"kills: {args.kills}, problems: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    raise SystemExit(main())
