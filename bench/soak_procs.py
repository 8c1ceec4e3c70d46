"""Processes of the soaks: the iteration command, our language-model server, orphan checks.

Every process is started in a session of its own (so one `killpg` takes it and everything it
started, e.g. Prefect's temporary API server) and carries `NIP_SOAK_TAG=<tag>` in its
environment, which its children inherit; a tagged process still alive after its group was
killed is an orphan (it left the group, e.g. with a session of its own).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
TAG_ENV = "NIP_SOAK_TAG"
RESERVED_PORTS = {5000}  # the default configuration's server port: never ours


def free_port() -> int:
    """A loopback port nothing listens on now (never one of `RESERVED_PORTS`)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in RESERVED_PORTS:
            return port


def soak_env(work: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the iteration commands: an own Prefect home, no telemetry, no wandb."""
    env = dict(os.environ)
    env.update(
        PREFECT_HOME=str(work / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        WANDB_MODE="disabled",
    )
    env.update(extra or {})
    return env


def start(command: Sequence[str], env: Mapping[str, str], log: Path, tag: str) -> subprocess.Popen:
    """`command` in a new session (its own process group), output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(command),
            cwd=REPO,
            env={**env, TAG_ENV: tag},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def iteration_command(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "flows.malt_iteration", *args]


def kill_group(process: subprocess.Popen) -> bool:
    """SIGKILL the process's whole group and reap it; True if it was still running."""
    alive = process.poll() is None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return alive


def tagged(tag: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment carries this soak tag."""
    found = []
    for proc in psutil.process_iter(["status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(TAG_ENV) == tag:
                found.append(proc)
    return found


def reap_orphans(tag: str, settle: float = 0.3) -> list[str]:
    """Kill (by process group) every tagged process left alive; returns their command lines."""
    time.sleep(settle)  # let the kernel finish delivering the group kill
    found = []
    for proc in tagged(tag):
        with contextlib.suppress(psutil.Error):
            found.append(f"{proc.pid}: {' '.join(proc.cmdline())[:160]}")
            group = os.getpgid(proc.pid)
            if group != os.getpgid(0):
                os.killpg(group, signal.SIGKILL)
            else:
                proc.kill()
    return found


def wait_http(url: str, process: subprocess.Popen, timeout: float = 120.0) -> None:
    """Wait until GET `url` answers 200 (raises if the process dies or time runs out)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout} s")
        time.sleep(0.2)


@contextlib.contextmanager
def lm_server(
    port: int, state_dir: Path, env: Mapping[str, str], tag: str, fake_train_seconds: float = 0.0
) -> Iterator[str]:
    """Our language-model server with the deterministic dummy engine; yields its base URL."""
    command = [
        sys.executable, "-m", "nip_core.lm_server", "--engine", "dummy",
        "--host", "127.0.0.1", "--port", str(port), "--state-dir", str(state_dir),
        "--fake-train-seconds", str(fake_train_seconds),
    ]  # fmt: skip
    process = start(command, env, state_dir.parent / f"{state_dir.name}.log", tag)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", process)
        yield url
    finally:
        kill_group(process)


def server_jobs(url: str) -> dict[str, list[str]]:
    """Group -> ids of the fine-tune jobs the server holds for it (all of them, any status)."""
    jobs: dict[str, list[str]] = {}
    after = None
    while True:
        params = {"limit": 100, **({"after": after} if after else {})}
        page = httpx.get(f"{url}/v1/fine_tuning/jobs", params=params, timeout=30).json()
        for job in page["data"]:
            group = (job.get("metadata") or {}).get("nip_group", "?")
            jobs.setdefault(group, []).append(job["id"])
        if not page.get("has_more") or not page["data"]:
            return jobs
        after = page["data"][-1]["id"]
