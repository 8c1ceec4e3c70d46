"""Training child processes: spawn them in their own process group, check and end them.

A child gets its own session so that a crash or a cancel never touches the server, and so that it
can outlive a server restart; liveness checks compare the kernel's start time to tell a
re-used pid from our child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nip_core

_REPO_ROOT = str(Path(nip_core.__file__).resolve().parent.parent)


def process_start_time(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot (Linux /proc), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; split after the ")" that closes the command name, which may contain spaces.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has finished its work
        return None
    return int(fields[19])


def is_alive(pid: int, start_time: int | None) -> bool:
    """True if the process `pid` is running and is the same process we started."""
    current = process_start_time(pid)
    return current is not None and (start_time is None or current == start_time)


def training_command(
    job_dir: Path, num_processes: int = 1, deepspeed_config: str | None = None
) -> list[str]:
    """The training child's argv: `python -m nip_core.lm_server.train_job <job_dir>`, or the
    same module under `accelerate launch` on `num_processes` GPUs (optionally DeepSpeed)."""
    job = ["-m", "nip_core.lm_server.train_job", str(job_dir)]
    if num_processes == 1 and deepspeed_config is None:
        return [sys.executable, *job]
    launch = [sys.executable, "-m", "accelerate.commands.launch"]
    launch += ["--num_processes", str(num_processes)]
    if num_processes > 1:
        launch += ["--multi_gpu"]
    if deepspeed_config is not None:
        launch += ["--use_deepspeed", "--deepspeed_config_file", str(deepspeed_config)]
    return [*launch, *job]


def spawn_training(
    job_dir: Path, num_processes: int = 1, deepspeed_config: str | None = None
) -> subprocess.Popen:
    """Start the training child (`training_command`) with its log in the job dir."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    with open(job_dir / "train.log", "ab") as log:
        return subprocess.Popen(
            training_command(job_dir, num_processes, deepspeed_config),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )


def kill_group(pid: int, start_time: int | None, grace: float = 5.0) -> None:
    """SIGTERM the child's process group, then SIGKILL it if it is still there after `grace`."""
    if not is_alive(pid, start_time):
        return
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not is_alive(pid, start_time):
            return
        time.sleep(0.05)
    _signal_group(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the child leads its own session, so its pgid is its pid
    except ProcessLookupError:
        pass


def train_log_tail(job_dir: Path, lines: int = 8) -> str:
    """The last lines of a child's log, to explain a crash in the job's error message."""
    try:
        text = (job_dir / "train.log").read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])
