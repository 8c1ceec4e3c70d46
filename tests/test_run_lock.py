"""Run-folder lock: live lock refused, stale lock taken over, released on exit and on errors.

pytest tests/test_run_lock.py
"""

import json
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, replace

import pytest

from nip_core.run.lock import (
    LOCK_NAME,
    LockInfo,
    RunLockedError,
    clear_stale_lock,
    process_start_tick,
    read_lock,
    run_lock,
)


def plant_lock(run_dir, pid, hostname=None, proc_start=None, started=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    info = LockInfo(
        pid=pid,
        hostname=hostname or socket.gethostname(),
        started=started or time.time(),
        proc_start=proc_start,
        token="planted",
    )
    (run_dir / LOCK_NAME).write_text(json.dumps(asdict(info)))
    return info


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_lock_created_with_owner_and_removed_on_exit(tmp_path):
    run_dir = tmp_path / "run"
    with run_lock(run_dir) as lock:
        info = read_lock(lock)
        assert lock == run_dir / LOCK_NAME
        assert info.pid == os.getpid()
        assert info.hostname == socket.gethostname()
        assert abs(info.started - time.time()) < 60
    assert not (run_dir / LOCK_NAME).exists()


def test_lock_released_when_block_raises(tmp_path):
    with pytest.raises(KeyError), run_lock(tmp_path):
        raise KeyError("boom")
    assert not (tmp_path / LOCK_NAME).exists()
    with run_lock(tmp_path):  # can be taken again
        pass


def test_live_lock_is_refused_with_pid_in_message(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        plant_lock(tmp_path, sleeper.pid, proc_start=process_start_tick(sleeper.pid))
        with pytest.raises(RunLockedError, match=f"pid {sleeper.pid}"), run_lock(tmp_path):
            pass
        assert read_lock(tmp_path / LOCK_NAME).token == "planted"  # untouched
    finally:
        sleeper.kill()
        sleeper.wait()


def test_second_lock_in_same_process_is_refused(tmp_path):
    with run_lock(tmp_path), pytest.raises(RunLockedError, match="in use"), run_lock(tmp_path):
        pass
    assert not (tmp_path / LOCK_NAME).exists()


def test_stale_lock_of_dead_pid_is_taken_over_with_warning(tmp_path, caplog):
    pid = dead_pid()
    plant_lock(tmp_path, pid)
    with caplog.at_level(logging.WARNING, logger="nip_core.run.lock"), run_lock(tmp_path) as lock:
        assert read_lock(lock).pid == os.getpid()
    assert f"pid {pid}" in caplog.text and "stale" in caplog.text
    assert not (tmp_path / LOCK_NAME).exists()
    assert not list(tmp_path.glob(".lock*"))  # no leftovers from the take-over


def test_clear_stale_lock_removes_a_dead_holders_lock_only(tmp_path):
    assert not clear_stale_lock(tmp_path)  # no lock at all
    plant_lock(tmp_path, os.getpid(), proc_start=process_start_tick(os.getpid()))
    assert not clear_stale_lock(tmp_path) and (tmp_path / LOCK_NAME).exists()  # alive: kept
    plant_lock(tmp_path, dead_pid())
    assert clear_stale_lock(tmp_path)
    assert not list(tmp_path.glob(".lock*"))


def test_reused_pid_with_other_start_time_counts_as_stale(tmp_path):
    tick = process_start_tick(os.getpid())
    if tick is None:
        pytest.skip("no /proc on this system")
    plant_lock(tmp_path, os.getpid(), proc_start=tick + 12345)
    with run_lock(tmp_path) as lock:
        assert read_lock(lock).token != "planted"


def test_lock_of_other_host_is_respected(tmp_path):
    plant_lock(tmp_path, dead_pid(), hostname="another-host.example")
    with pytest.raises(RunLockedError, match="another-host.example"), run_lock(tmp_path):
        pass


def test_unreadable_lock_young_is_refused_old_is_taken_over(tmp_path):
    lock = tmp_path / LOCK_NAME
    lock.write_text("")
    with pytest.raises(RunLockedError, match="still writing"), run_lock(tmp_path):
        pass
    old = time.time() - 600
    os.utime(lock, (old, old))
    with run_lock(tmp_path) as taken:
        assert read_lock(taken).pid == os.getpid()


def test_release_leaves_a_lock_that_is_no_longer_ours(tmp_path):
    with run_lock(tmp_path) as lock:
        theirs = replace(read_lock(lock), token="someone-else")
        lock.write_text(json.dumps(asdict(theirs)))
    assert read_lock(tmp_path / LOCK_NAME).token == "someone-else"


def test_non_local_root_is_not_locked(tmp_path):
    with run_lock(tmp_path / "bucket" / "run", local=False) as lock:
        assert lock is None
    assert not (tmp_path / "bucket").exists()


def test_two_processes_race_for_one_folder(tmp_path):
    """Exactly one of several simultaneous starters wins."""
    code = (
        "import sys, time\n"
        "from nip_core.run.lock import run_lock, RunLockedError\n"
        "try:\n"
        "    with run_lock(sys.argv[1]):\n"
        "        time.sleep(2)\n"
        "    print('won')\n"
        "except RunLockedError:\n"
        "    print('refused')\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outcomes = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outcomes == ["refused"] * 3 + ["won"]
