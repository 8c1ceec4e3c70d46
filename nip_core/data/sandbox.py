"""Run untrusted candidate code against HumanEval-style tests in a locked-down subprocess.

Each run gets a fresh temporary directory as its working directory, an environment holding only
PATH, an isolated interpreter (`python -I`), limits on address space, CPU time and file size, a
wall-clock timeout, and no network: the child replaces the `socket` constructors with a function
that raises before the candidate runs. Where the kernel allows it, the child also runs in new
user, mount, network and PID namespaces with a read-only filesystem outside its folder and a
capped process count (`nip_core.data.isolation`), so nothing it starts outlives it; elsewhere
at least in an empty network namespace where `unshare --net` works.

A run passes only if `check(<entry_point>)` returns and the child prints a per-run nonce
afterwards, so a candidate that exits early with status 0 still fails.

Usage::

    result = run_candidate(solution, test, "add", timeout=5)
    results = run_candidates([(solution, test, "add"), ...], workers=2)
"""

from __future__ import annotations

import functools
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from nip_core.data.isolation import namespace_prefix, process_cap, walls_env

DEFAULT_MEMORY_MB = 1024
_OUTPUT_LIMIT_BYTES = 1 << 20
_NO_NET_PATH = "/usr/bin:/bin"
# How `_execute`/`_failure_reason` word failures caused by a limit rather than by the tests.
_LIMIT_REASONS = (
    "timeout after ",
    "CPU time limit (",
    "output size limit (",
    "killed (",
    "MemoryError",
)

# Executed by the child before the candidate: limits, no sockets, then the tests.
_RUNNER = """\
import resource, socket, sys
def _limit(kind, value):
    resource.setrlimit(kind, (value, value))
_limit(resource.RLIMIT_AS, {memory_bytes})
_limit(resource.RLIMIT_CPU, {cpu_seconds})
_limit(resource.RLIMIT_FSIZE, {fsize_bytes})
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in the sandbox")
for _name in ("socket", "create_connection", "create_server", "socketpair", "fromfd"):
    setattr(socket, _name, _no_network)
with open("candidate.py", encoding="utf-8") as _file:
    _source = _file.read()
_namespace = {{"__name__": "candidate"}}
exec(compile(_source, "candidate.py", "exec"), _namespace)
_namespace["check"](_namespace[{entry_point!r}])
sys.stdout.write({nonce!r})
sys.stdout.flush()
"""


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one sandboxed run; `reason` says why it failed ("passed" when it did not)."""

    passed: bool
    reason: str

    @property
    def hit_limit(self) -> bool:
        """True when the run failed on the time, CPU, output or memory limit or a signal, which
        can depend on the machine, rather than by an error or failed assertion in the tests."""
        return not self.passed and self.reason.startswith(_LIMIT_REASONS)


@functools.cache
def network_isolation_prefix() -> tuple[str, ...]:
    """The `unshare` command prefix that works here, or () when none does (checked once)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    for prefix in ((unshare, "--net"), (unshare, "--net", "--map-root-user")):
        try:
            probe = subprocess.run(
                [*prefix, sys.executable, "-I", "-c", "pass"],
                capture_output=True,
                timeout=10,
                env={"PATH": _NO_NET_PATH},
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return prefix
    return ()


def candidate_program(solution: str, test: str) -> str:
    """The file the child executes: the solution followed by the test code defining `check`."""
    return f"{solution}\n\n{test}\n"


def run_candidate(
    solution: str,
    test: str,
    entry_point: str,
    timeout: float = 10,
    *,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> ExecutionResult:
    """Run `check(entry_point)` from `test` against `solution` in the sandbox.

    Args:
        solution: Python source defining `entry_point`.
        test: Python source defining `check(candidate)`, which raises when the candidate is wrong.
        entry_point: Name of the function under test.
        timeout: Wall-clock limit in seconds; the CPU limit is this rounded up plus one.
        memory_mb: Address-space limit of the child in MiB.

    Returns:
        ExecutionResult(passed, reason); a timeout, crash or limit hit counts as failing.
    """
    if not entry_point.isidentifier():
        raise ValueError(f"entry_point must be a Python identifier, got {entry_point!r}")
    if timeout <= 0 or memory_mb <= 0:
        raise ValueError(f"timeout and memory_mb must be positive, got {timeout}, {memory_mb}")
    nonce = f"nip-sandbox-ok-{secrets.token_hex(8)}"
    runner = _RUNNER.format(
        memory_bytes=memory_mb * 1024 * 1024,
        cpu_seconds=math.ceil(timeout) + 1,
        fsize_bytes=_OUTPUT_LIMIT_BYTES,
        entry_point=entry_point,
        nonce=nonce,
    )
    with tempfile.TemporaryDirectory(prefix="nip-sandbox-") as workdir, process_cap() as cap:
        Path(workdir, "candidate.py").write_text(candidate_program(solution, test), "utf-8")
        walls = namespace_prefix()
        if walls:
            env = walls_env(Path(workdir))
        else:  # at least no network where `unshare --net` works
            walls, env = network_isolation_prefix(), {"PATH": os.environ.get("PATH", _NO_NET_PATH)}
        command = [*cap, *walls, sys.executable, "-I", "-c", runner]
        return _execute(command, Path(workdir), timeout, nonce, env)


def run_candidates(
    jobs: Sequence[tuple[str, str, str]], timeout: float = 10, *, workers: int = 2
) -> list[ExecutionResult]:
    """Run many `(solution, test, entry_point)` jobs, at most `workers` sandboxes at once.

    Each job is already its own process, so threads are enough to keep `workers` of them busy.
    """
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: run_candidate(*job, timeout=timeout), jobs))


def _execute(
    command: list[str], workdir: Path, timeout: float, nonce: str, env: dict[str, str]
) -> ExecutionResult:
    """Start the child in its own session, wait up to `timeout`, and classify the outcome."""
    stdout_path, stderr_path = workdir / "stdout.txt", workdir / "stderr.txt"
    with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            return ExecutionResult(False, f"timeout after {timeout:g}s")
    _kill_group(process)
    if returncode == 0 and _tail(stdout_path).endswith(nonce):
        return ExecutionResult(True, "passed")
    return ExecutionResult(False, _failure_reason(returncode, _tail(stderr_path)))


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kill the child's whole session so nothing it spawned outlives the run."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _tail(path: Path, limit: int = 4096) -> str:
    """The last `limit` bytes of a file as text (outputs can be large; only the end matters)."""
    with open(path, "rb") as file:
        file.seek(max(0, path.stat().st_size - limit))
        return file.read().decode("utf-8", errors="replace").strip()


def _failure_reason(returncode: int, stderr_tail: str) -> str:
    """A short human-readable cause: the last error line, or the signal that ended the child."""
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = {"SIGXCPU": "CPU time limit", "SIGXFSZ": "output size limit"}.get(name, "killed")
        return f"{hint} ({name})"
    lines = [line for line in stderr_tail.splitlines() if line.strip()]
    if lines:
        return lines[-1][:300]
    return f"exited with status {returncode} before the tests completed"
