"""The sandbox runs candidate code against tests with a timeout, limits, no network and no env."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from nip_core.data.sandbox import (
    ExecutionResult,
    network_isolation_prefix,
    run_candidate,
    run_candidates,
)

CHECK_CALL = "def check(candidate):\n    candidate()\n"


def _listening_server() -> tuple[socket.socket, int]:
    """A local TCP server the candidate would reach if networking were allowed."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    threading.Thread(target=lambda: server.accept(), daemon=True).start()
    return server, server.getsockname()[1]


def test_correct_solution_passes_and_wrong_one_fails() -> None:
    solution = "def add(a, b):\n    return a + b\n"
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    assert run_candidate(solution, test, "add") == ExecutionResult(True, "passed")
    wrong = run_candidate(solution.replace("+", "-"), test, "add")
    assert not wrong.passed and "AssertionError" in wrong.reason


def test_exception_is_reported() -> None:
    result = run_candidate("def f():\n    return 1 / 0\n", CHECK_CALL, "f")
    assert not result.passed and "ZeroDivisionError" in result.reason


def test_early_clean_exit_does_not_count_as_passing() -> None:
    solution = "import sys\ndef f():\n    sys.exit(0)\n"
    assert not run_candidate(solution, CHECK_CALL, "f").passed


def test_wall_clock_timeout_is_enforced() -> None:
    started = time.monotonic()
    result = run_candidate("import time\ndef f():\n    time.sleep(60)\n", CHECK_CALL, "f", 1)
    assert result == ExecutionResult(False, "timeout after 1s")
    assert time.monotonic() - started < 10


def test_busy_loop_is_stopped() -> None:
    result = run_candidate("def f():\n    while True:\n        pass\n", CHECK_CALL, "f", 1)
    assert not result.passed and ("timeout" in result.reason or "CPU" in result.reason)


def test_memory_limit_is_enforced() -> None:
    solution = "def f():\n    return bytearray(3 * 1024 ** 3)\n"
    result = run_candidate(solution, CHECK_CALL, "f", memory_mb=512)
    assert not result.passed and "MemoryError" in result.reason
    small = "def f():\n    return bytearray(16 * 1024 ** 2)\n"
    assert run_candidate(small, CHECK_CALL, "f", memory_mb=512).passed


def test_socket_module_is_blocked() -> None:
    server, port = _listening_server()
    solution = f"import socket\ndef f():\n    socket.create_connection(('127.0.0.1', {port}), 2)\n"
    with server:
        result = run_candidate(solution, CHECK_CALL, "f", 5)
        assert not result.passed and "network access is disabled" in result.reason
        control = socket.create_connection(("127.0.0.1", port), 2)  # the server was reachable
        control.close()


def test_raw_socket_is_blocked_by_network_namespace() -> None:
    if not network_isolation_prefix():
        pytest.skip("unshare --net does not work on this machine")
    server, port = _listening_server()
    solution = (
        "import _socket\ndef f():\n    s = _socket.socket()\n"
        f"    s.settimeout(2)\n    s.connect(('127.0.0.1', {port}))\n"
    )
    with server:
        result = run_candidate(solution, CHECK_CALL, "f", 5)
    assert not result.passed and "OSError" in result.reason


def test_environment_is_empty_and_cwd_is_a_fresh_temp_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIP_SANDBOX_SECRET", "do-not-leak")
    here = os.getcwd()
    solution = (
        "import os\ndef f():\n"
        "    assert set(os.environ) <= {'PATH', 'LC_CTYPE'}, sorted(os.environ)\n"
        f"    assert os.getcwd() != {here!r}\n"
        "    assert sorted(os.listdir('.')) == ['candidate.py', 'stderr.txt', 'stdout.txt']\n"
        "    open('left_behind.txt', 'w').write('x')\n"
    )
    result = run_candidate(solution, CHECK_CALL, "f")
    assert result.passed, result.reason
    assert run_candidate(solution, CHECK_CALL, "f").passed  # the next run starts clean again
    assert not os.path.exists(os.path.join(here, "left_behind.txt"))


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="entry_point"):
        run_candidate("", CHECK_CALL, "not an identifier")
    with pytest.raises(ValueError, match="positive"):
        run_candidate("", CHECK_CALL, "f", timeout=0)


def test_run_candidates_keeps_job_order() -> None:
    test = "def check(candidate):\n    assert candidate() == 1\n"
    jobs = [(f"def f():\n    return {value}\n", test, "f") for value in (1, 2, 1, 3)]
    assert [r.passed for r in run_candidates(jobs, timeout=5)] == [True, False, True, False]
