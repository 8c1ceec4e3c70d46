"""Helpers shared by the language-model server tests: start a real server process, wait, stop."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai

REPO = Path(__file__).resolve().parent.parent
LIVE_SERVERS: list[Server] = []  # read by conftest's report hook when a test fails


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One `python -m nip_core.lm_server` child process on a free port."""

    def __init__(self, args: list[str], state_dir: Path, token: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.state_dir = state_dir
        self.token = token
        env = dict(os.environ, PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
        env.pop("NIP_LM_SERVER_TOKEN", None)
        if token:
            env["NIP_LM_SERVER_TOKEN"] = token
        self.log = state_dir.parent / f"server-{self.port}.log"
        command = [sys.executable, "-m", "nip_core.lm_server", "--port", str(self.port)]
        command += ["--state-dir", str(state_dir), *args]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        LIVE_SERVERS.append(self)

    def describe(self, chars: int = 3000) -> str:
        """The server's state and the tail of its log, for a failing test's report."""
        code = self.proc.poll()
        state = "running" if code is None else f"exited with code {code}"
        try:
            tail = self.log.read_text(errors="replace")[-chars:]
        except OSError as exc:
            tail = f"(log unreadable: {exc})"
        return f"{self.url} ({state}), log {self.log}:\n{tail}"

    def wait_ready(self, timeout: float = 120) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready:\n{self.log.read_text()[-3000:]}")

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key=self.token or "unused", max_retries=0
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self in LIVE_SERVERS:
            LIVE_SERVERS.remove(self)
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def running_server(
    args: list[str], state_dir: Path, token: str | None = None, start_timeout: float = 120
):
    server = Server(args, state_dir, token).wait_ready(start_timeout)
    try:
        yield server
    finally:
        server.stop()
        kill_training_children(state_dir)


def kill_training_children(state_dir: Path) -> None:
    """End training children a stopped server left behind (they outlive it by design)."""
    from nip_core.lm_server.procs import kill_group

    for job_file in state_dir.glob("jobs/*/job.json"):
        job = json.loads(job_file.read_text())
        if job.get("_pid"):
            kill_group(job["_pid"], job.get("_pid_start"), grace=2)


def upload(client: openai.OpenAI, lines: list[dict] | str):
    text = lines if isinstance(lines, str) else "".join(json.dumps(x) + "\n" for x in lines)
    return client.files.create(file=("train.jsonl", io.BytesIO(text.encode())), purpose="fine-tune")


def wait_job(
    client: openai.OpenAI, job_id: str, states=("succeeded", "failed", "cancelled"), timeout=120
):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in states:
            return job
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} stuck in {job.status}")


def train_job(server, base: str, method: dict, lines: list[dict], nip: dict, timeout: float):
    """A fine-tuning job of `lines` on `base` through the openai SDK, waited for; it must
    succeed. (the job, its output folder)"""
    client = server.client()
    job = client.fine_tuning.jobs.create(
        model=base,
        training_file=upload(client, lines).id,
        method=method,
        suffix=method["type"],
        extra_body={"nip_training": nip},
    )
    done = wait_job(client, job.id, timeout=timeout)
    assert done.status == "succeeded", done.error
    return done, server.state_dir / "jobs" / job.id / "output"


def dpo_lines(count: int = 8) -> list[dict]:
    return [
        {
            "input": {"messages": [{"role": "user", "content": f"Is {i}+{i}={2 * i}? Answer."}]},
            "preferred_output": [{"role": "assistant", "content": "Yes, accept."}],
            "non_preferred_output": [{"role": "assistant", "content": "No, reject."}],
        }
        for i in range(count)
    ]


def verdict_pairs(count: int = 2) -> list[dict]:
    """TRL's conversational DPO rows (prompt, chosen, rejected), for trainers built directly:
    a buggy function each, "reject" preferred to "accept"."""
    return [
        {
            "prompt": [{"role": "user", "content": f"Is def f(x): return x - {i} correct?"}],
            "chosen": [{"role": "assistant", "content": "Decision: reject"}],
            "rejected": [{"role": "assistant", "content": "Decision: accept"}],
        }
        for i in range(count)
    ]


def kto_lines(count: int = 8) -> list[dict]:
    """Unpaired answers, two desirable to every undesirable one (KTO weighs the imbalance)."""
    return [
        {
            "input": {"messages": [{"role": "user", "content": f"Is {i}+{i}={2 * i}? Answer."}]},
            "output": [{"role": "assistant", "content": "No, reject." if i % 3 == 2 else "Yes."}],
            "label": i % 3 != 2,
        }
        for i in range(count)
    ]


def sft_lines(count: int = 8) -> list[dict]:
    return [
        {
            "messages": [
                {"role": "system", "content": "You judge code."},
                {"role": "user", "content": f"Check solution {i}."},
                {"role": "assistant", "content": "Verdict: accept accept accept."},
            ]
        }
        for i in range(count)
    ]
