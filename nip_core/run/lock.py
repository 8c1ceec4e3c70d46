"""One writer per run folder: `<run_dir>/.lock`, created atomically, removed on exit.

    with run_lock(paths.run_dir, local=paths.is_local):
        ...  # write the run's artifacts

Two processes writing the same run folder would interleave manifests and shards. The lock file
records who holds it (pid, hostname, process start time); a second run refuses to start while
that process is alive, and takes over a lock left behind by a process that died (SIGKILL, OOM).
Object-store roots (S3) are locked by a lease taken with a conditional create instead
(`nip_core.run.object_store_lock`, which says exactly what that guarantees).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nip_core.run.artifacts import RunPaths
from nip_core.run.object_store_lock import (
    ObjectStoreLockedError,
    acquire_lease,
    hold_lease,
    supports_conditional_create,
)

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
# An unreadable lock younger than this may still be being written by its creator.
UNREADABLE_GRACE_S = 5.0


class RunLockedError(RuntimeError):
    """The run folder is held by another live process."""


@dataclass(frozen=True)
class LockInfo:
    """Who holds a run folder: written as JSON into the lock file."""

    pid: int
    hostname: str
    started: float  # time.time() when the lock was taken
    proc_start: int | None  # kernel start tick of the holder, tells a reused pid apart
    token: str  # unique per acquisition, so we only ever delete our own lock

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on {self.hostname} (since {when})"


def process_start_tick(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (Linux /proc), or None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may contain spaces, so split after its ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def holder_alive(info: LockInfo) -> bool:
    """Whether the lock's holder still runs; a different host counts as alive (cannot check)."""
    if info.hostname != socket.gethostname():
        return True
    if not pid_alive(info.pid):
        return False
    current = process_start_tick(info.pid)
    return info.proc_start is None or current is None or current == info.proc_start


def read_lock(lock: Path) -> LockInfo | None:
    """The lock's content, or None when it is missing or unreadable."""
    try:
        data = json.loads(lock.read_text())
        return LockInfo(**data)
    except (OSError, ValueError, TypeError):
        return None


def _new_info() -> LockInfo:
    pid = os.getpid()
    return LockInfo(
        pid=pid,
        hostname=socket.gethostname(),
        started=time.time(),
        proc_start=process_start_tick(pid),
        token=uuid.uuid4().hex,
    )


def _try_create(lock: Path, info: LockInfo) -> bool:
    """Create the lock file atomically (O_EXCL); False if it already exists."""
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(asdict(info)))
        f.flush()
        os.fsync(f.fileno())
    return True


def _locked_error(lock: Path, holder: LockInfo | None) -> RunLockedError:
    who = holder.describe() if holder else "a process that is still writing the lock file"
    return RunLockedError(
        f"run folder {lock.parent} is in use by {who}; wait for that run to finish or use "
        f"another run name (if that process is gone for good, delete {lock})"
    )


def _take_over_stale(lock: Path, seen: LockInfo | None) -> None:
    """Remove a stale lock, unless someone replaced it since we read it (then: locked)."""
    aside = lock.with_name(f"{LOCK_NAME}.stale-{uuid.uuid4().hex}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return  # another process removed it first; just retry creating ours
    moved = read_lock(aside)
    if moved != seen:  # we moved a fresh lock of a live process: put it back
        with contextlib.suppress(FileExistsError):
            os.link(aside, lock)
        aside.unlink(missing_ok=True)
        raise _locked_error(lock, moved)
    aside.unlink(missing_ok=True)
    who = seen.describe() if seen else "an unreadable lock file"
    log.warning("taking over the stale lock of %s on %s: that process is gone", who, lock.parent)


def _is_stale(lock: Path, holder: LockInfo | None) -> bool:
    if holder is not None:
        return not holder_alive(holder)
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return True
    return age > UNREADABLE_GRACE_S


def acquire(run_dir: str | os.PathLike, attempts: int = 5) -> tuple[Path, LockInfo]:
    """Take the run folder's lock (creating the folder); raises RunLockedError if held."""
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_NAME
    info = _new_info()
    for _ in range(attempts):
        if _try_create(lock, info):
            return lock, info
        holder = read_lock(lock)
        if not _is_stale(lock, holder):
            raise _locked_error(lock, holder)
        _take_over_stale(lock, holder)
    raise RunLockedError(f"could not take the lock {lock}: it keeps changing hands")


def clear_stale_lock(run_dir: str | os.PathLike) -> bool:
    """Remove `<run_dir>/.lock` when its holder is gone; True if one was removed.

    A run killed after its last write (while shutting down) leaves its lock behind, and a rerun
    that answers a finished run from its manifest takes no lock, so nothing would ever remove
    it. A live holder's lock (or an unreadable one still within its grace period) stays.
    """
    lock = Path(run_dir) / LOCK_NAME
    if not lock.exists():
        return False
    holder = read_lock(lock)
    if not _is_stale(lock, holder):
        return False
    try:
        _take_over_stale(lock, holder)
    except RunLockedError:
        return False
    return not lock.exists()


def release(lock: Path, info: LockInfo) -> None:
    """Delete the lock if it is still ours (never someone else's)."""
    current = read_lock(lock)
    if current is not None and current.token == info.token:
        lock.unlink(missing_ok=True)
    else:
        log.warning("lock %s no longer belongs to this run; left in place", lock)


def _lease_holder_is_gone(lease: dict) -> bool:
    """A lease taken on this host by a process that no longer runs."""
    if lease.get("hostname") != socket.gethostname() or not isinstance(lease.get("pid"), int):
        return False
    holder = LockInfo(
        lease["pid"], lease["hostname"], lease.get("started", 0.0), lease.get("proc_start"), ""
    )
    return not holder_alive(holder)


@contextlib.contextmanager
def run_lock(
    run_dir: str | os.PathLike, *, local: bool = True, fs: Any = None
) -> Iterator[Path | str | None]:
    """Hold `<run_dir>/.lock` for the duration of the block; yields the lock path.

    `local=False`: an object store's lease lock on `fs` (see `object_store_lock`); without
    conditional create there, the folder is not locked (a warning says so) and None is yielded.
    """
    if not local:
        path = f"{str(run_dir).rstrip('/')}/{LOCK_NAME}"
        if fs is None or not supports_conditional_create(fs):
            log.warning("run folder %s: this store has no conditional create; not locked", run_dir)
            yield None
            return
        me = {"pid": os.getpid(), "proc_start": process_start_tick(os.getpid())}
        try:
            token = acquire_lease(fs, path, owner=me, holder_is_gone=_lease_holder_is_gone)
        except ObjectStoreLockedError as e:
            raise RunLockedError(str(e)) from None
        with hold_lease(fs, path, token):
            yield path
        return
    lock, info = acquire(run_dir)
    try:
        yield lock
    finally:
        release(lock, info)


def lock_run_folder(paths: RunPaths) -> contextlib.AbstractContextManager[Path | str | None]:
    """`run_lock` for a run's folder (a lease lock on object stores)."""
    return run_lock(paths.run_dir, local=paths.is_local, fs=paths.fs)
