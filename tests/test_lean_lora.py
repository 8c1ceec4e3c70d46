"""The lean LoRA forward: PEFT's result and gradients, its extra work at the adapter's rank."""

from __future__ import annotations

import pytest
import torch

from nip_core.lm_server import training
from nip_core.lm_server.lean_lora import lean_forward, use_lean_lora_forward
from nip_core.lm_server.options import TrainingOptions
from tests.conftest_lm import verdict_pairs
from tests.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def peft_model(model_dir, precision="fp32", **lora):
    """A tiny causal LM with LoRA on every linear layer, its B matrices non-zero (PEFT starts
    them at zero, which would hide the adapter's share of the output)."""
    from peft import get_peft_model

    torch.manual_seed(0)
    options = TrainingOptions(method="dpo", lora_rank=4, lora_dropout=0.0, precision=precision)
    model, config, _ = training.load_for_training(str(model_dir), None, options)
    for key, value in lora.items():
        setattr(config, key, value)
    model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    return model.train()


def loss_and_lora_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def lora_layers(model):
    return [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]


def test_fp32_loss_and_gradients_match_peft(tiny_model_dir):
    model = peft_model(tiny_model_dir)
    ids = torch.randint(0, model.config.vocab_size, (2, 24))
    loss, grads = loss_and_lora_grads(model, ids)
    assert grads and all("lora_" in name for name in grads)  # only the adapters train

    assert use_lean_lora_forward(model) == len(lora_layers(model)) > 0
    lean_loss, lean_grads = loss_and_lora_grads(model, ids)
    assert torch.allclose(lean_loss, loss, atol=1e-5, rtol=0)
    assert lean_grads.keys() == grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(lean_grads[name], grad, atol=1e-5, rtol=1e-4), name
    assert use_lean_lora_forward(model) == 0  # already lean


def test_bf16_weights_compute_in_bf16_and_keep_fp32_adapters(tiny_model_dir):
    # The tiny random model's gradients are too small for bf16 to resolve their direction
    # (PEFT's own bf16 path is as far from fp32); on SmolLM2 see the module docstring.
    model = peft_model(tiny_model_dir, precision="bf16")
    ids = torch.randint(0, model.config.vocab_size, (2, 24))
    loss, grads = loss_and_lora_grads(model, ids)
    use_lean_lora_forward(model)
    lean_loss, lean_grads = loss_and_lora_grads(model, ids)
    assert abs(lean_loss.item() - loss.item()) < 0.02 * abs(loss.item())
    assert lean_grads.keys() == grads.keys()
    for grad in lean_grads.values():
        assert grad.dtype == torch.float32  # the optimizer's copy stays fp32
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    layer = lora_layers(model)[0]
    assert layer(torch.ones(1, 3, layer.in_features, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_disabled_adapters_give_the_base_model(tiny_model_dir):
    model = peft_model(tiny_model_dir)
    ids = torch.randint(0, model.config.vocab_size, (1, 16))
    with torch.no_grad(), model.disable_adapter():
        base = model(input_ids=ids).logits  # PEFT's own forward
    use_lean_lora_forward(model)
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            lean_base = model(input_ids=ids).logits
    assert not torch.allclose(adapted, base, atol=1e-3)  # the adapters change the output
    assert torch.equal(lean_base, base)


def test_variants_take_peft_own_forward(tiny_model_dir):
    model = peft_model(tiny_model_dir, use_dora=True)
    ids = torch.randint(0, model.config.vocab_size, (1, 16))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    use_lean_lora_forward(model)
    layer = lora_layers(model)[0]
    assert layer.forward.__func__ is lean_forward
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, expected, atol=1e-6)


def test_the_trainer_trains_with_the_lean_forward(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    options = TrainingOptions(
        method="dpo", batch_size=1, n_epochs=1, learning_rate=1e-2, lora_rank=4
    )
    tokenizer = training.load_tokenizer(str(tiny_model_dir))
    model, peft_config, _ = training.load_for_training(str(tiny_model_dir), None, options)
    trainer = training.build_trainer(
        options, model, tokenizer, verdict_pairs(), str(tmp_path), peft_config
    )
    layers = lora_layers(trainer.model)
    assert layers and all(layer.forward.__func__ is lean_forward for layer in layers)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(after[n].detach(), before[n]) for n in before)  # B learned
