"""Start our language-model server as a process of its own, and find out whose server answers.

The server is started in its own session (it outlives a killed flow, so a rerun re-attaches to
it and to its fine-tune jobs). Its `/health` names its owner (the run folder that started it),
its state folder and its process, so a run can tell its own server from another run's on the
same port (`server_identity`). Which port, engine and flags a run needs is the caller's business
(`flows/lm_server.py` reads them from the agents' settings); this module knows only the server's
command line, so the server package imports nothing of the pipeline. `supervise.py` keeps a
run's own server up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class ServerHandle:
    """A server a run uses. `process`: the run started it; `pid`: the run's own server left by an
    earlier, killed invocation; neither: another run's or the user's (never stopped)."""

    url: str
    process: subprocess.Popen | None
    pid: int | None = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        elif self.process is None and self.pid is not None:
            _terminate_pid(self.pid)


def _terminate_pid(pid: int, grace: float = 30.0) -> None:
    """SIGTERM a server that is not our child, SIGKILL it when it is still there after `grace`."""
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def server_identity(url: str, timeout: float = 2.0) -> dict | None:
    """What `/health` at `url` says (owner, state_dir, pid, engine, version; an older or foreign
    server may give fewer fields), or None when nothing answers there with 200."""
    try:
        response = httpx.get(f"{url}/health", timeout=timeout, trust_env=False)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def same_folder(a: str | Path | None, b: str | Path | None) -> bool:
    """Whether two folder names are the same folder (None matches nothing)."""
    if a is None or b is None:
        return False
    return Path(a).resolve() == Path(b).resolve()


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on `host:port` now (nothing bound there)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the system has free now (it may be taken before it is used: callers re-check)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def server_command(
    port: int,
    engine: str,
    options: Sequence[str] = (),
    state_dir: Path | None = None,
    owner: str | None = None,
) -> list[str]:
    """The command line of `python -m nip_core.lm_server` on 127.0.0.1:`port`."""
    command = [
        sys.executable, "-m", "nip_core.lm_server",
        "--engine", engine, "--host", "127.0.0.1", "--port", str(port), *options,
    ]  # fmt: skip
    if state_dir is not None:
        command += ["--state-dir", str(state_dir)]
    if owner is not None:
        command += ["--owner", owner]
    return command


def spawn_server(command: Sequence[str], log_path: Path) -> subprocess.Popen:
    """Start the server command in a session of its own, its output appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            list(command), stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )


def wait_until_up(
    url: str,
    process: subprocess.Popen,
    log_path: Path,
    timeout: float,
) -> None:
    """Wait until `process` answers at `url` (another server that took the port, as its `/health`
    pid tells, does not count). RuntimeError, with the log's tail, when it exits first;
    TimeoutError (the process killed) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        identity = server_identity(url)
        if identity is not None and identity.get("pid", process.pid) == process.pid:
            return
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(
                f"the language-model server exited with {process.returncode}:\n{tail}"
            )
        if time.monotonic() > deadline:
            process.kill()
            raise TimeoutError(f"the language-model server did not start within {timeout} s")
        time.sleep(0.5)


def default_timeout(engine: str) -> float:
    """Seconds to wait for a start: vLLM's takes minutes on a busy CPU."""
    return 1800.0 if engine == "vllm" else 600.0
