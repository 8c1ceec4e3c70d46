"""Supervise one vLLM server process: launch it in its own process group, read its log, end it.

vLLM starts worker processes of its own (the engine core, one per GPU), so it gets a new session
and is ended by signalling the whole group: SIGTERM, then SIGKILL after a grace period. Its output
goes to a log file whose tail explains a crash.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from nip_core.lm_server.engines.vllm.config import VllmServeConfig, vllm_command, vllm_env
from nip_core.lm_server.procs import is_alive, process_start_time

LOG_TAIL_LINES = 40


class VllmError(RuntimeError):
    """vLLM failed to start, crashed, or answered with a server error."""


def port_in_use(host: str, port: int) -> bool:
    """Whether something already accepts connections there (it would answer our health checks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def log_tail(log_path: Path, offset: int, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines written to `log_path` after byte `offset`."""
    try:
        with log_path.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return "(log unavailable)"
    return "\n".join(text.splitlines()[-lines:]) or "(log empty)"


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a process group, ignoring one that is already gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def pid_file(log_path: Path, port: int) -> Path:
    """Where the vLLM process on `port` started with this log records its process group."""
    return log_path.with_name(f"{log_path.stem}-port{port}.pid")


def end_stale_vllm(log_path: Path, port: int, grace: float = 30.0) -> int | None:
    """SIGKILL the group of a vLLM that a killed server of ours left running (its pid file names
    a live process with the same start time), so a restarted server gets the port back; the
    group's pid, or None when there was none."""
    try:
        record = json.loads(pid_file(log_path, port).read_text())
        pid, start = int(record["pid"]), record.get("start")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not is_alive(pid, start):
        return None
    signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while is_alive(pid, start) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


def end_stale_vllms(folder: Path, grace: float = 30.0) -> list[int]:
    """`end_stale_vllm` for every vLLM pid file in a server's state `folder`: the groups a server
    that was killed (or interrupted while it started) left running; their pids."""
    ended = []
    for record in sorted(Path(folder).glob("*-port*.pid")):
        stem, _, port = record.stem.rpartition("-port")
        if not port.isdigit():
            continue
        pid = end_stale_vllm(record.with_name(f"{stem}.log"), int(port), grace)
        if pid is not None:
            ended.append(pid)
    return ended


class VllmProcess:
    """One launched vLLM server; appends to `log_path` and remembers where its output starts."""

    def __init__(self, config: VllmServeConfig, log_path: Path) -> None:
        cmd = vllm_command(config)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        with log_path.open("ab") as log:
            log.write(f"\n==== nip: launching {' '.join(cmd)}\n".encode())
            log.flush()
            self.log_offset = log.tell()
            try:
                self.popen = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=vllm_env(config=config),
                    start_new_session=True,  # own process group: terminate() reaches workers
                )
            except FileNotFoundError as exc:
                raise VllmError(
                    f"vLLM executable {cmd[0]!r} not found; build the vLLM environment with "
                    "scripts/setup_vllm.sh (or on a GPU: pip install '.[vllm]')"
                ) from exc
        record = {"pid": self.popen.pid, "start": process_start_time(self.popen.pid)}
        self.pid_file = pid_file(log_path, config.port)
        self.pid_file.write_text(json.dumps(record))

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        """None while running, else the exit code (negative: killed by that signal)."""
        return self.popen.poll()

    def tail(self) -> str:
        """The end of this process's own output, for error messages."""
        return f"log tail ({self.log_path}):\n{log_tail(self.log_path, self.log_offset)}"

    async def terminate(self, grace: float) -> None:
        """SIGTERM the group, wait up to `grace` s, then SIGKILL whatever is left of it."""
        signal_group(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.popen.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        signal_group(self.pid, signal.SIGKILL)  # also reaps workers that outlived the leader
        try:
            await asyncio.to_thread(self.popen.wait, 10)
        except subprocess.TimeoutExpired as exc:
            raise VllmError(f"vLLM (pid {self.pid}) did not exit even after SIGKILL") from exc
        self.pid_file.unlink(missing_ok=True)
