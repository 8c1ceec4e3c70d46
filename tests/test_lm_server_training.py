"""End-to-end training through the server with the transformers engine and a tiny random model.

The model is a 2-layer Llama with hidden size 32 and the SmolLM2 tokenizer, built once per module.
Jobs use a high learning rate for a few steps so that greedy answers of the adapter certainly
differ from the base model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest_lm import dpo_lines, kto_lines, running_server, sft_lines, train_job, upload
from tests.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow
PROMPT = [{"role": "user", "content": "Is 3+3=6? Answer."}]
FAST = {"learning_rate": 0.01, "lora_rank": 8, "seed": 3}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    args = ["--engine", "transformers", "--model", str(tiny_model)]
    with running_server(args, tmp_path_factory.mktemp("hf") / "state") as srv:
        yield srv


def _greedy(client, model: str) -> str:
    reply = client.chat.completions.create(
        model=model, messages=PROMPT, temperature=0, max_tokens=8
    )
    return reply.choices[0].message.content


def _train(server, base: str, method: dict, lines: list[dict], nip: dict):
    return train_job(server, base, method, lines, nip, timeout=240)


def test_chat_n_samples_and_greedy_is_stable(server, tiny_model):
    client = server.client()
    reply = client.chat.completions.create(
        model=str(tiny_model), messages=PROMPT, n=3, temperature=1.0, seed=7, max_tokens=6
    )
    assert len(reply.choices) == 3 and reply.usage.completion_tokens > 0
    assert all(c.finish_reason in ("stop", "length") for c in reply.choices)
    assert len({c.message.content for c in reply.choices}) > 1
    greedy = client.chat.completions.create(
        model=str(tiny_model), messages=PROMPT, n=2, temperature=0, max_tokens=6
    )
    assert greedy.choices[0].message.content == greedy.choices[1].message.content


@pytest.fixture(scope="module")
def dpo_job(server, tiny_model):
    method = {"type": "dpo", "dpo": {"hyperparameters": {"n_epochs": 2, "batch_size": 4}}}
    return _train(server, str(tiny_model), method, dpo_lines(8), FAST)


def test_dpo_job_produces_a_served_adapter_that_answers_differently(server, tiny_model, dpo_job):
    done, output = dpo_job
    assert (output / "adapter_model.safetensors").is_file()
    assert json.loads((output / "adapter_config.json").read_text())["r"] == 8
    assert (output / "tokenizer_config.json").is_file()
    assert done.trained_tokens and done.trained_tokens > 0
    client = server.client()
    assert done.fine_tuned_model in [m.id for m in client.models.list()]
    assert _greedy(client, done.fine_tuned_model) != _greedy(client, str(tiny_model))
    events = [e.message for e in client.fine_tuning.jobs.list_events(done.id, limit=100)]
    assert any(m.startswith("Step ") and "loss=" in m for m in events)


def test_kto_job_trains_unpaired_answers_with_weights_from_their_labels(server, tiny_model):
    method = {"type": "kto", "kto": {"hyperparameters": {"n_epochs": 2, "batch_size": 2}}}
    done, output = _train(server, str(tiny_model), method, kto_lines(9), FAST)
    assert (output / "adapter_model.safetensors").is_file()
    client = server.client()
    assert _greedy(client, done.fine_tuned_model) != _greedy(client, str(tiny_model))
    events = [e.message for e in client.fine_tuning.jobs.list_events(done.id, limit=100)]
    # the first event names the device and the precision this CPU trains in
    assert any(m.startswith("Training kto") and " on cpu, frozen weights in " in m for m in events)
    assert any(m.startswith("Step ") and "loss=" in m for m in events)
    with pytest.raises(Exception, match="batch_size >= 2"):
        one = {"type": "kto", "kto": {"hyperparameters": {"batch_size": 1}}}
        client.fine_tuning.jobs.create(
            model=str(tiny_model), training_file=upload(client, kto_lines(4)).id, method=one
        )


def test_sft_job_produces_a_served_adapter_that_answers_differently(server, tiny_model):
    method = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}
    done, output = _train(server, str(tiny_model), method, sft_lines(8), dict(FAST, lora_alpha=32))
    assert json.loads((output / "adapter_config.json").read_text())["lora_alpha"] == 32
    client = server.client()
    assert _greedy(client, done.fine_tuned_model) != _greedy(client, str(tiny_model))


def test_stacking_on_a_fine_tuned_adapter_grows_the_rank(server, dpo_job):
    parent, _ = dpo_job
    nip = dict(FAST, lora_rank=4, stack_lora_adapters=True)
    done, output = _train(server, parent.fine_tuned_model, {"type": "dpo"}, dpo_lines(4), nip)
    config = json.loads((output / "adapter_config.json").read_text())
    assert config["r"] == 12 and config["lora_alpha"] == 12
    assert not (output / "new").exists()
    assert done.fine_tuned_model != parent.fine_tuned_model
    _greedy(server.client(), done.fine_tuned_model)  # the stacked adapter is servable


def test_full_fine_tune_without_lora(server, tiny_model):
    nip = {"use_lora": False, "learning_rate": 0.01}
    done, output = _train(server, str(tiny_model), {"type": "supervised"}, sft_lines(4), nip)
    assert (output / "config.json").is_file() and not (output / "adapter_config.json").exists()
    client = server.client()
    assert _greedy(client, done.fine_tuned_model) != _greedy(client, str(tiny_model))
