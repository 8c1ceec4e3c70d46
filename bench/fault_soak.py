"""Fault soak: a MALT iteration against a server behind a proxy that breaks 20 % of chat replies.

    python bench/fault_soak.py                     # 20 % of chat requests failed, seed 0
    python bench/fault_soak.py --rate 0.5 --seed 3 --work /tmp/fault-soak

Starts our language-model server with the deterministic dummy engine
(`python -m nip_core.lm_server --engine dummy`) and runs `python -m flows.malt_iteration` with
every agent on `model_provider=SelfHosted` at port P: once as the reference, the server itself
listening on P; then, in another folder under the same run name and with a fresh server (own
state folder) on port Q, through `bench/fault_proxy.py` listening on P. The configuration, hence
every artifact, is the same for both runs; the proxy fails a seeded `--rate` of
`POST /v1/chat/completions` requests in turn with HTTP 429 (Retry-After: 1), 500, 503, a dropped
connection, a 200 with a non-UTF-8 body, a 200 with an HTML page and a 200 with the real reply
cut in half, and forwards everything else (fine-tuning, adapters, health) unchanged. The dummy
engine answers depend only on (model, messages, seed, sample index), so a retried request gets
the answer the reference got and the artifacts must be identical, with the fine-tune job ids
(random per server) mapped to the reference's (`bench/soak_compare.py`).

Prints the faults injected per kind, then the run's exit status, the comparison (differing files,
lost, duplicate and extra rows), duplicate fine-tune jobs (the server's jobs per group beyond the
first; the job list is read from the server itself, not through the proxy) and wall times.
Targets: exit status 0, every fault kind injected, all counts 0. Last line: `problems: N`; the
exit status is 1 when N > 0.
"""

from __future__ import annotations

import argparse
import functools
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

from bench.fault_proxy import FAULT_KINDS, FaultProxy  # noqa: E402
from bench.soak_compare import Comparison, compare_runs, duplicate_jobs, job_id_map  # noqa: E402
from bench.soak_procs import (  # noqa: E402
    free_port,
    iteration_command,
    kill_group,
    lm_server,
    reap_orphans,
    server_jobs,
    soak_env,
    start,
)

RUN = "soak"
OVERRIDES = [
    "agents._default.model_provider=SelfHosted",
    "agents._default.use_dummy_api=false",
    "rl.rollouts_per_iteration=8",
    "text_rl.rollout_shard_size=2",
    "nip_protocol.max_message_rounds=5",
]
RUN_TIMEOUT = 600.0


@dataclass
class FaultSoakResult:
    injected: Counter = field(default_factory=Counter)
    chat_requests: int = 0
    exit_status: int | None = None
    reference_wall: float = 0.0
    faulted_wall: float = 0.0
    comparison: Comparison = field(default_factory=Comparison)
    duplicate_jobs: int = 0
    jobs: dict[str, list[str]] = field(default_factory=dict)
    orphans: list[str] = field(default_factory=list)

    @property
    def missing_kinds(self) -> list[str]:
        return [kind for kind in FAULT_KINDS if not self.injected[kind]]

    @property
    def problems(self) -> int:
        failed = int(self.exit_status != 0) + len(self.missing_kinds) + len(self.orphans)
        return failed + self.comparison.problems + self.duplicate_jobs


def run_iteration(root: Path, port: int, overrides: list[str], env: dict, tag: str) -> int:
    """One iteration with the agents on the server at `port`; its exit status."""
    args = [
        f"--set={o}" for o in [*overrides, f"agents._default.language_model_server_port={port}"]
    ]
    args += ["--run-name", RUN, "--artifacts-root", str(root), "--no-wandb"]
    process = start(iteration_command(args), env, root.parent / f"{root.name}.log", tag)
    try:
        return process.wait(RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        return -1
    finally:
        kill_group(process)


def fault_soak(
    work: Path,
    *,
    rate: float,
    seed: int,
    overrides: list[str],
    env: dict | None = None,
    max_faults_per_request: int = 3,
) -> FaultSoakResult:
    """The reference and the faulted run (see the module doc)."""
    result, tag = FaultSoakResult(), f"fault-soak-{uuid.uuid4().hex[:8]}"
    environment = soak_env(work, env)
    port, upstream_port = free_port(), free_port()
    began = time.monotonic()
    with lm_server(port, work / "reference-server", environment, tag):
        status = run_iteration(work / "reference", port, overrides, environment, tag)
    if status != 0:
        raise RuntimeError(f"the reference run failed ({status}); see {work}/reference.log")
    result.reference_wall = time.monotonic() - began
    began = time.monotonic()
    with lm_server(upstream_port, work / "faulted-server", environment, tag) as upstream:
        proxy = FaultProxy(
            upstream, rate=rate, seed=seed, max_faults_per_request=max_faults_per_request
        )
        proxy.start(port=port)
        try:
            result.exit_status = run_iteration(work / "faulted", port, overrides, environment, tag)
        finally:
            proxy.stop()
        result.jobs = server_jobs(upstream)
    result.faulted_wall = time.monotonic() - began
    result.injected, result.chat_requests = proxy.injected, proxy.chat_requests
    result.orphans = reap_orphans(tag)
    ref_dir, run_dir = work / "reference" / RUN, work / "faulted" / RUN
    it = Path("iterations") / "0000"
    job_ids = job_id_map(ref_dir / it, run_dir / it)
    result.comparison = compare_runs(ref_dir, run_dir, job_ids)
    result.duplicate_jobs = duplicate_jobs(result.jobs)
    return result


def report(result: FaultSoakResult, echo=print) -> None:
    kinds = ", ".join(f"{kind} {result.injected[kind]}" for kind in FAULT_KINDS)
    total = sum(result.injected.values())
    echo(f"faults injected: {total} of {result.chat_requests} chat requests ({kinds})")
    echo(f"fault kinds never injected: {result.missing_kinds or 'none'}")
    echo(f"faulted run exit status: {result.exit_status}")
    echo(f"reference run {result.reference_wall:.1f} s, faulted run {result.faulted_wall:.1f} s")
    echo(result.comparison.summary())
    for line in result.comparison.differing:
        echo(f"  {line}")
    jobs = {group: len(ids) for group, ids in result.jobs.items()}
    echo(f"duplicate fine-tune jobs: {result.duplicate_jobs} (jobs per group {jobs})")
    echo(f"orphaned processes: {len(result.orphans)} {result.orphans or ''}")
    echo(f"problems: {result.problems}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=0.2, help="share of chat requests failed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, help="folder for the runs (default: a temp folder)")
    parser.add_argument("--set", action="append", default=[], help="more overrides")
    args = parser.parse_args(argv)
    echo = functools.partial(print, flush=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="fault-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    echo(f"work folder: {work}")
    began = time.monotonic()
    result = fault_soak(work, rate=args.rate, seed=args.seed, overrides=OVERRIDES + args.set)
    echo(f"soak wall: {time.monotonic() - began:.1f} s")
    report(result, echo)
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
