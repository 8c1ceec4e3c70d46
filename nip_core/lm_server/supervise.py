"""Keep a run's own language-model server up: when it dies, start it again on the same port.

A run that started its server owns it. A watcher thread waits on the process; when it exits
without being asked to (a crash, an out-of-memory kill, a stray `kill -9`) the same command is
started again on the same port and state folder, so the new server re-attaches the fine-tune
jobs and adapters the old one left there, while the run's clients retry their calls. Each
restart (its cause, how long the server was away) is logged, appended to `restarts.jsonl` in
the state folder and listed in `restarts`; after `max_restarts` the watcher gives up and says
why in `gave_up`.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from nip_core.lm_server.engines.vllm.process import end_stale_vllms
from nip_core.lm_server.launch import ServerHandle, spawn_server, wait_until_up
from nip_core.model_api.jsonl import jsonl_lines

log = logging.getLogger(__name__)
RESTARTS_FILE = "restarts.jsonl"


def exit_cause(returncode: int | None) -> str:
    """How a process ended, in words: `killed by SIGKILL`, `exited with 1`."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with {returncode}"


class SupervisedServer(ServerHandle):
    """A server this run started (`start`) and restarts when it dies, until `stop`."""

    def __init__(
        self,
        url: str,
        command: Sequence[str],
        state_dir: Path,
        timeout: float,
        max_restarts: int = 3,
    ) -> None:
        super().__init__(url, None)
        self.command = list(command)
        self.state_dir = state_dir
        self.log_path = state_dir / "server.log"
        self.timeout = timeout
        self.max_restarts = max_restarts
        self.restarts: list[dict] = []
        self.gave_up: str | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    def start(self) -> SupervisedServer:
        """Start the server, wait until it answers, then watch it."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log.warning("starting the language-model server on %s (log: %s)", self.url, self.log_path)
        self.process = spawn_server(self.command, self.log_path)
        try:
            wait_until_up(self.url, self.process, self.log_path, self.timeout)
        except BaseException:  # failed, timed out, or the flow was told to stop meanwhile
            self.stop()
            raise
        self._watcher = threading.Thread(target=self._watch, name="lm-server-watch", daemon=True)
        self._watcher.start()
        return self

    def stop(self) -> None:
        """Stop the server, then whatever vLLM it left running: a server SIGKILLed after its
        grace (stuck starting, or waiting on a request) cannot stop its vLLM children."""
        self._stopping.set()
        with self._lock:
            super().stop()
        ended = end_stale_vllms(self.state_dir, grace=10)
        if ended:
            log.warning("ended vLLM process groups %s that the stopped server left", ended)
        if self._watcher is not None:
            self._watcher.join(timeout=35)

    def detach(self) -> None:
        """Leave the server running for others and stop watching it (`stop` then does nothing)."""
        self._stopping.set()
        with self._lock:
            self.process = None

    def _watch(self) -> None:
        while True:
            process = self.process
            if process is None:
                return
            returncode = process.wait()
            if self._stopping.is_set():
                return
            cause = exit_cause(returncode)
            if len(self.restarts) >= self.max_restarts:
                self.gave_up = (
                    f"the run's language-model server at {self.url} died ({cause}) after "
                    f"{len(self.restarts)} restarts; its log: {self.log_path}"
                )
                log.error("%s", self.gave_up)
                return
            self._restart(cause, returncode)

    def _restart(self, cause: str, returncode: int | None) -> None:
        number = len(self.restarts) + 1
        log.warning(
            "the language-model server at %s died (%s); restarting it (%d of at most %d)",
            self.url, cause, number, self.max_restarts,
        )  # fmt: skip
        started = time.monotonic()
        with self._lock:
            if self._stopping.is_set():
                return
            self.process = spawn_server(self.command, self.log_path)
        record = {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "cause": cause,
            "returncode": returncode,
            "pid": self.process.pid,
        }
        try:
            wait_until_up(self.url, self.process, self.log_path, self.timeout)
            record["answered_after_seconds"] = round(time.monotonic() - started, 3)
            log.warning("the language-model server at %s answers again", self.url)
        except (RuntimeError, TimeoutError) as error:
            record["failed"] = str(error).splitlines()[0]
        self.restarts.append(record)
        with open(self.state_dir / RESTARTS_FILE, "a") as out:
            out.write(json.dumps(record) + "\n")


def read_restarts(state_dir: Path) -> list[dict]:
    """Every restart recorded in a server state folder (`restarts.jsonl`), oldest first."""
    path = state_dir / RESTARTS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for _, line in jsonl_lines(path.read_text(encoding="utf-8"))]
