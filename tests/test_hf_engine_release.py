"""On CPU the transformers engine drops its weights while a job trains and reloads them after.

The training child shares the machine's RAM with the server, so `release_accelerator` frees the
served model; any request (or `reacquire_accelerator`) reloads the base model and every adapter
in the order they were loaded, and answers are the same as before the release.
"""

from __future__ import annotations

import asyncio

import pytest

from nip_core.lm_server.engines.base import ChatRequest
from nip_core.lm_server.engines.hf import TransformersEngine
from nip_core.lm_server.engines.hf_batching import peft_adapter_name
from tests.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow
PROMPT = [{"role": "user", "content": "Is 1+1=2?"}]


def _random_adapter(model_dir, out, seed: int):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def model_and_adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    model_dir = build_tiny_model(root / "tiny")
    adapters = [_random_adapter(model_dir, root / f"lora{i}", seed=i) for i in (1, 2)]
    return model_dir, adapters


async def _greedy(engine: TransformersEngine, model: str) -> str:
    request = ChatRequest(model=model, messages=PROMPT, n=1, temperature=0, max_tokens=6)
    (choice,) = await engine.chat(request)
    return choice.text


async def _scenario(model_dir, first, second) -> None:
    engine = TransformersEngine(str(model_dir))
    await engine.start()
    try:
        await engine.load_adapter("a1", str(first))
        await engine.load_adapter("a2", str(second))
        names = (str(model_dir), "a1", "a2")
        before = {name: await _greedy(engine, name) for name in names}
        assert len(set(before.values())) > 1  # the adapters really change the answers

        await engine.release_accelerator()
        assert not engine.weights_loaded
        assert engine.models() == list(names)  # still advertised while released
        assert await _greedy(engine, "a2") == before["a2"]  # a request reloads everything
        assert engine.weights_loaded
        assert {name: await _greedy(engine, name) for name in names} == before

        await engine.release_accelerator()
        await engine.reacquire_accelerator()
        assert engine.weights_loaded
        await engine.unload_adapter("a1")
        assert await _greedy(engine, "a2") == before["a2"]
        assert await _greedy(engine, str(model_dir)) == before[str(model_dir)]
    finally:
        await engine.stop()


def test_release_drops_weights_and_any_request_reloads_them(model_and_adapters):
    model_dir, (first, second) = model_and_adapters
    asyncio.run(_scenario(model_dir, first, second))


async def _dotted_names(model_dir, first, second) -> None:
    """Served names built from run names with dots (`sweep-lr0.5`) load, serve and unload."""
    engine = TransformersEngine(str(model_dir))
    await engine.start()
    try:
        await engine.load_adapter("plain", str(first))
        expected = await _greedy(engine, "plain")
        dotted = "ft:tiny:sweep-lr0.5-it0-verifier"
        await engine.load_adapter(dotted, str(first))
        await engine.load_adapter("ft:tiny:sweep-lr0_5-it0-verifier", str(second))
        assert await _greedy(engine, dotted) == expected
        await engine.unload_adapter(dotted)
        assert dotted not in engine.models()
    finally:
        await engine.stop()


def test_adapter_names_with_dots_are_served(model_and_adapters):
    model_dir, (first, second) = model_and_adapters
    asyncio.run(_dotted_names(model_dir, first, second))
    assert peft_adapter_name("a.b") not in ("a.b", "a_b", peft_adapter_name("a_b"))
    assert "." not in peft_adapter_name("x.y.z") and peft_adapter_name("ok-name") == "ok-name"
