"""The sandbox against hostile candidates: every attack fails to get out (where the kernel lets
us build the walls; elsewhere these tests say so and skip)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from nip_core.data.isolation import _pids_root, namespace_prefix
from nip_core.data.sandbox import run_candidate

walls = pytest.mark.skipif(not namespace_prefix(), reason="no user/mount/pid namespaces here")


def run(body: str, check: str, timeout: float = 10):
    solution = "def f():\n" + "\n".join("    " + line for line in body.strip().splitlines())
    return run_candidate(solution, f"def check(candidate):\n    {check}\n", "f", timeout=timeout)


def test_an_infinite_loop_is_stopped_at_the_timeout():
    result = run("while True:\n    pass", "candidate()", timeout=2)
    assert not result.passed and result.hit_limit


def test_a_4_gb_allocation_fails():
    result = run("return bytearray(4 * 2**30)", "candidate()")
    assert not result.passed and "MemoryError" in result.reason


@walls
def test_setsid_children_do_not_outlive_the_run():
    marker = f"{uuid.uuid4().int % 10**6}.25"
    body = f"""
import subprocess
for _ in range(3):
    subprocess.Popen(["sleep", "{marker}"], start_new_session=True)
return 1
"""
    assert run(body, "assert candidate() == 1").passed
    alive = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert alive.stdout.strip() == "", "a setsid child outlived the sandbox"


@pytest.mark.skipif(_pids_root() is None, reason="no pids cgroup can be created here")
def test_a_fork_loop_stops_at_the_process_cap():
    body = """
import os, time
started = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    started += 1
return started
"""
    result = run(body, "assert candidate() < 100, 'no cap'")
    assert result.passed, result.reason


@walls
def test_writing_outside_the_temporary_folder_fails():
    target = Path("/tmp") / f"nip-escape-{uuid.uuid4().hex}"
    body = f"""
try:
    open({str(target)!r}, "w").write("x")
except OSError:
    return "blocked"
return "written"
"""
    assert run(body, "assert candidate() == 'blocked'").passed
    assert not target.exists()


@walls
def test_secrets_in_the_home_folder_are_hidden(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_key").write_text("SECRET")
    monkeypatch.setenv("HOME", str(home))
    body = f"""
try:
    return open({str(home / ".ssh" / "id_key")!r}).read()
except OSError:
    return "hidden"
"""
    assert run(body, "assert candidate() == 'hidden'").passed


def test_sockets_are_refused():
    body = """
import socket
try:
    socket.create_connection(("127.0.0.1", 9), timeout=1)
except OSError as e:
    return "refused"
return "connected"
"""
    assert run(body, "assert candidate() == 'refused'").passed
