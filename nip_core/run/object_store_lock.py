"""The run-folder lock on an object store (S3 and the like): a lease taken by conditional create.

Object stores have no exclusive-create file and no atomic rename, but S3 has a conditional PUT
(`If-None-Match: *`, s3fs's `mode="create"`): of several processes creating `<run_dir>/.lock`,
exactly one succeeds. The winner holds a lease of `LEASE_SECONDS`, renewed every
`LEASE_SECONDS / 4` by a background thread while the run is going; it deletes the lock at the end.

What this guarantees: while the holder runs and can reach the store, nobody else gets the lock.
A lock whose lease has run out (its holder was killed, or lost the store for a whole lease), or
whose holder ran on this host and is no longer alive, is taken over: deleted, then created again conditionally. Two processes taking over the same
expired lock at the same moment may both delete it, but only one of them creates the new one.
A holder cut off from the store for longer than a lease may find its lock taken over; it then
notices at the next renewal and logs an error (it cannot stop writes already under way).
Stores without conditional create are not locked (a warning says so).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

LEASE_SECONDS = 120.0


class ObjectStoreLockedError(RuntimeError):
    """Another live run holds the lease."""


def _read(fs: Any, path: str) -> dict | None:
    try:
        return json.loads(fs.cat_file(path))
    except (FileNotFoundError, ValueError):
        return None


def _create(fs: Any, path: str, lease: dict) -> bool:
    """Conditional create; False when the object already exists."""
    try:
        fs.pipe_file(path, json.dumps(lease).encode(), mode="create")
    except FileExistsError:
        return False
    except OSError as e:  # some S3 servers report the failed condition as a plain 412
        if e.errno == errno.EINVAL or "PreconditionFailed" in str(e) or "412" in str(e):
            return False
        raise
    return True


def _new_lease(token: str, owner: dict) -> dict:
    now = time.time()
    return {
        "token": token,
        "hostname": socket.gethostname(),
        **owner,
        "started": now,
        "expires": now + LEASE_SECONDS,
    }


def acquire_lease(
    fs: Any,
    path: str,
    attempts: int = 3,
    owner: dict | None = None,
    holder_is_gone: Callable[[dict], bool] | None = None,
) -> str:
    """Take the lease at `path` (an object key); returns its token. `owner` is recorded in the
    lease (e.g. the pid); `holder_is_gone(lease)` may say that a lease whose time has not run out
    belongs to a process known to be dead (same host), so it is taken over at once."""
    token = uuid.uuid4().hex
    for _ in range(attempts):
        if _create(fs, path, _new_lease(token, owner or {})):
            return token
        holder = _read(fs, path)
        gone = holder is not None and holder_is_gone is not None and holder_is_gone(holder)
        if holder is not None and holder.get("expires", 0) > time.time() and not gone:
            raise ObjectStoreLockedError(
                f"run folder {path.rsplit('/', 1)[0]} is in use by a run on "
                f"{holder.get('hostname')} (lease until "
                f"{time.strftime('%H:%M:%S', time.localtime(holder['expires']))}); wait for it or "
                "use another run name"
            )
        log.warning("taking over the expired lock %s", path)
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(path)
    raise ObjectStoreLockedError(f"could not take the lock {path}: it keeps changing hands")


def supports_conditional_create(fs: Any) -> bool:
    """Whether `fs` is an S3 store (s3fs's `mode="create"` is a conditional PUT)."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
    return bool({"s3", "s3a"} & set(protocols))


@contextlib.contextmanager
def hold_lease(fs: Any, path: str, token: str) -> Iterator[str]:
    """Keep the lease at `path` renewed for the block; delete it at the end if still ours."""
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(LEASE_SECONDS / 4):
            current = _read(fs, path)
            if current is None or current.get("token") != token:
                log.error("the lock %s was taken over by another run", path)
                return
            renewed = {**current, "expires": time.time() + LEASE_SECONDS}
            with contextlib.suppress(OSError):
                fs.pipe_file(path, json.dumps(renewed).encode())

    thread = threading.Thread(target=renew, name="lock-lease", daemon=True)
    thread.start()
    try:
        yield token
    finally:
        stop.set()
        thread.join(5)
        current = _read(fs, path)
        if current is not None and current.get("token") == token:
            fs.rm_file(path)
