"""`lora_top_layers`: LoRA on the model's last N transformer layers only, so the backward pass
stops below them (`bench/dpo_step.py --compare-lora-top-layers N` times it)."""

from __future__ import annotations

import re

import pytest
import torch

from nip_core.lm_server import training
from nip_core.lm_server.options import OptionsError, TrainingOptions, parse_options
from tests.conftest_lm import verdict_pairs
from tests.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_the_option_is_parsed_and_checked():
    assert parse_options({"type": "dpo"}, {}).lora_top_layers is None
    assert parse_options({"type": "dpo"}, {"lora_top_layers": 3}).lora_top_layers == 3
    for bad in (0, 1.5, "2", True):
        with pytest.raises(OptionsError) as raised:
            parse_options({"type": "dpo"}, {"lora_top_layers": bad})
        assert raised.value.param == "lora_top_layers"


def test_more_layers_than_the_model_has_is_refused(tiny_model_dir):
    options = TrainingOptions(method="dpo", lora_top_layers=3)  # the tiny model has 2
    with pytest.raises(OptionsError, match="lora_top_layers is 3 but the model has 2 layers"):
        training.load_for_training(str(tiny_model_dir), None, options)


def _layer(name: str) -> int:
    return int(re.search(r"\.layers\.(\d+)\.", name).group(1))


def test_a_dpo_job_trains_only_the_top_layers_and_computes_no_gradient_below(
    tiny_model_dir, tmp_path
):
    torch.manual_seed(0)
    options = TrainingOptions(
        method="dpo",
        batch_size=1,
        n_epochs=1,
        learning_rate=1e-2,
        lora_rank=4,
        lora_dropout=0.0,
        lora_top_layers=1,
    )
    tokenizer = training.load_tokenizer(str(tiny_model_dir))
    model, peft_config, strategy = training.load_for_training(str(tiny_model_dir), None, options)
    assert strategy == "new" and peft_config.layers_to_transform == [1]
    rows = verdict_pairs()
    trainer = training.build_trainer(options, model, tokenizer, rows, str(tmp_path), peft_config)
    trained = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trained and {_layer(n) for n in trained} == {1}
    before = {n: p.detach().clone() for n, p in trained.items()}
    # the bottom layer's output never needs a gradient: the backward pass stops above it
    bottom = training.transformer_backbone(trainer.model).layers[0]
    needs_grad = []
    bottom.register_forward_hook(
        lambda mod, args, out: needs_grad.append(
            (out[0] if isinstance(out, tuple) else out).requires_grad
        )
    )
    trainer.train()
    assert needs_grad and not any(needs_grad)
    assert any(not torch.equal(before[n], p) for n, p in trained.items() if "lora_B" in n)


def test_a_stacked_adapter_keeps_the_layers_of_both():
    from nip_core.lm_server.stacking import _layers_of_both

    top = {"layers_to_transform": [28, 29]}
    assert _layers_of_both([{"layers_to_transform": None}, top]) is None  # parent: every layer
    assert _layers_of_both([{}, top]) is None
    assert _layers_of_both([{"layers_to_transform": [20, 29]}, top]) == [20, 28, 29]
    assert _layers_of_both([{"layers_to_transform": 3}, {"layers_to_transform": 1}]) == [1, 3]
