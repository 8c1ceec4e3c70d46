"""The walls around a sandboxed run: namespaces, a read-only filesystem and a process cap.

Where the kernel allows it (checked once per process), the child runs under `unshare` in new
user, mount, network and PID namespaces:
- **PID namespace**: the child is its namespace's init, so when it ends (or is killed at the
  timeout) the kernel kills everything it started, `setsid()` children included;
- **network namespace**: no interface but a downed loopback;
- **mount namespace**: every mount is remounted read-only except the run's own temporary folder,
  and the usual homes of secrets (`~/.ssh`, `~/.aws`, `~/.netrc`, `~/.config`,
  `~/.git-credentials`, `/home`, `/work`) are hidden under empty read-only mounts.
A **pids cgroup** (v1 `pids` or v2 with the `pids` controller, when this process may create one)
caps the processes of a run at `MAX_PROCESSES`, so a fork loop stops there.

What it does not do: the rest of the filesystem stays readable (the interpreter and its
libraries live there). Where a wall cannot be built, the run goes on with the others and one
warning names what is missing.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

MAX_PROCESSES = 64
_PROBE_PATH = "/usr/bin:/bin"
# Runs as the namespace's root before the candidate: bind the work folder, hide secrets, make
# every other mount read-only, then exec the interpreter.
_WALLS = r"""
mount --bind "$NIP_SANDBOX_DIR" "$NIP_SANDBOX_DIR" || exit 97
for hidden in $NIP_SANDBOX_HIDE; do
  if [ -d "$hidden" ]; then mount -t tmpfs -o ro,size=4k none "$hidden" || exit 97
  elif [ -f "$hidden" ]; then mount --bind /dev/null "$hidden" || exit 97; fi
done
awk '{print $5}' /proc/self/mountinfo | while read -r point; do
  [ "$point" = "$NIP_SANDBOX_DIR" ] || mount -o remount,bind,ro "$point" 2>/dev/null || true
done
cd "$NIP_SANDBOX_DIR" || exit 97  # the bind mount, not the read-only folder beneath it
exec env -i PATH="$PATH" "$@"  # the candidate sees PATH only
"""


def hidden_paths() -> list[str]:
    """Where secrets usually live, minus anything the interpreter needs."""
    home = Path.home()
    candidates = [home / name for name in (".ssh", ".aws", ".netrc", ".config", ".git-credentials")]
    candidates += [Path("/home"), Path("/work")]
    needed = [Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.executable}]
    return [
        str(c)
        for c in candidates
        if c.exists() and not any(n == c or c in n.parents for n in needed)
    ]


@functools.cache
def namespace_prefix() -> tuple[str, ...]:
    """The `unshare ... sh -c <walls>` prefix when it works here, else () (checked once)."""
    unshare, sh = shutil.which("unshare"), shutil.which("sh")
    if unshare is None or sh is None or shutil.which("mount") is None:
        log.warning("sandbox: no unshare/mount here; runs are not in namespaces")
        return ()
    prefix = (
        unshare, "--user", "--map-root-user", "--mount", "--net", "--pid", "--fork",
        "--kill-child", "--mount-proc", sh, "-c", _WALLS, "walls",
    )  # fmt: skip
    probe_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"nip-sandbox-probe-{uuid.uuid4().hex}"
    probe_dir.mkdir()
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-I", "-c", "open('probe', 'w').write('ok')"],
            cwd=probe_dir,
            env=walls_env(probe_dir),
            capture_output=True,
            timeout=20,
        )
        works = done.returncode == 0 and (probe_dir / "probe").read_text() == "ok"
    except (OSError, subprocess.SubprocessError):
        works = False
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
    if not works:
        log.warning("sandbox: the kernel refuses user/mount/pid namespaces; running without them")
        return ()
    return prefix


def walls_env(workdir: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", _PROBE_PATH),
        "NIP_SANDBOX_DIR": str(Path(workdir).resolve()),
        "NIP_SANDBOX_HIDE": " ".join(hidden_paths()),
    }


@functools.cache
def _pids_root() -> Path | None:
    for root in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        probe = root / f"nip-sandbox-probe-{uuid.uuid4().hex}"
        try:
            probe.mkdir()
        except OSError:
            continue
        usable = (probe / "pids.max").exists()
        probe.rmdir()
        if usable:
            return root
    log.warning("sandbox: cannot create a pids cgroup here; the process count is not capped")
    return None


@contextlib.contextmanager
def process_cap(limit: int = MAX_PROCESSES) -> Iterator[list[str]]:
    """A command prefix that puts the child into a fresh pids cgroup capped at `limit`
    (empty when cgroups are out of reach); the cgroup is removed afterwards."""
    root = _pids_root()
    if root is None:
        yield []
        return
    group = root / f"nip-sandbox-{uuid.uuid4().hex}"
    group.mkdir()
    (group / "pids.max").write_text(str(limit))
    try:
        yield ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group)]
    finally:
        for _ in range(50):  # the children are being killed; their cgroup empties shortly
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.02)
