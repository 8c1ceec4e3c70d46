"""Start our language-model server as a process of its own and wait until it answers.

The server is started in its own session (it outlives a killed flow, so a rerun re-attaches to
it and to its fine-tune jobs). Which port, engine and flags a run needs is the caller's business
(`flows/lm_server.py` reads them from the agents' settings); this module knows only the
server's command line, so the server package imports nothing of the pipeline.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

log = logging.getLogger(__name__)


@dataclass
class ServerHandle:
    url: str
    process: subprocess.Popen | None  # None: it was already running

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def is_up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def start_server(
    url: str,
    port: int,
    engine: str,
    options: Sequence[str] = (),
    state_dir: Path | None = None,
    timeout: float | None = None,
) -> ServerHandle:
    """Start `python -m nip_core.lm_server` on 127.0.0.1:`port` and wait until `url` answers.

    Its output goes to `<state_dir>/server.log` (`./server.log` without a state folder). Raises
    RuntimeError (with the log's tail) when it exits first, TimeoutError after `timeout` seconds
    (default: 30 minutes for vLLM, whose start takes minutes on a busy CPU; 10 otherwise).
    """
    if timeout is None:
        timeout = 1800.0 if engine == "vllm" else 600.0
    command = [
        sys.executable, "-m", "nip_core.lm_server",
        "--engine", engine, "--host", "127.0.0.1", "--port", str(port), *options,
    ]  # fmt: skip
    if state_dir is not None:
        state_dir.mkdir(parents=True, exist_ok=True)
        command += ["--state-dir", str(state_dir)]
    log_path = (state_dir or Path(".")) / "server.log"
    log.warning("starting the language-model server on %s (log: %s)", url, log_path)
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + timeout
    while not is_up(url):
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(
                f"the language-model server exited with {process.returncode}:\n{tail}"
            )
        if time.monotonic() > deadline:
            process.kill()
            raise TimeoutError(f"the language-model server did not start within {timeout} s")
        time.sleep(0.5)
    return ServerHandle(url, process)
