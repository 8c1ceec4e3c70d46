"""LoRA dropout with masks from bulk random words: the same regulariser as `nn.Dropout`."""

from __future__ import annotations

import pytest
import torch

from nip_core.lm_server import training
from nip_core.lm_server.lora_dropout import BulkRandomDropout, keep_mask, use_bulk_random_dropout
from nip_core.lm_server.options import TrainingOptions
from tests.conftest_lm import verdict_pairs
from tests.tiny_model import build_tiny_model


def lora_dropouts(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of every LoRA dropout dict (PEFT's `lora_dropout`) in `model`."""
    return [
        d for m in model.modules() if hasattr(m, "lora_dropout") for d in m.lora_dropout.values()
    ]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("p", [0.05, 0.3])
def test_every_position_is_dropped_with_probability_p_independently(p):
    torch.manual_seed(0)
    dropped = ~keep_mask((1000, 1200), p)
    flat = dropped.flatten().double()
    tolerance = 5 * (p * (1 - p) / flat.numel()) ** 0.5 * 4  # five sd, a quarter of the sample
    # each of the four 16-bit slices of a random word, the word's top one included
    for offset in range(4):
        assert abs(flat[offset::4].mean().item() - p) < tolerance
    # neighbours (inside a word and across words) are dropped together as often as chance says
    for lag in (1, 4, 5):
        together = (flat[:-lag] * flat[lag:]).mean().item()
        assert abs(together - p * p) < 5 * (p * p / flat.numel()) ** 0.5 * 2


def test_the_masks_follow_torch_seed():
    torch.manual_seed(3)
    first = keep_mask((7, 33), 0.1)
    torch.manual_seed(3)
    assert torch.equal(first, keep_mask((7, 33), 0.1))
    assert not torch.equal(first, keep_mask((7, 33), 0.1))


def test_it_scales_kept_values_and_their_gradients_as_dropout_does():
    torch.manual_seed(0)
    dropout = BulkRandomDropout(0.2)
    x = (torch.rand(64, 96) + 0.5).requires_grad_()
    out = dropout(x)
    kept = out != 0
    assert torch.allclose(out[kept], x[kept] / 0.8)
    assert 0.15 < 1 - kept.double().mean().item() < 0.25
    out.sum().backward()
    assert torch.allclose(x.grad, kept.float() / 0.8)
    dropout.eval()
    assert dropout(x) is x


def test_every_lora_dropout_of_a_peft_model_is_swapped_with_its_p_and_mode(tiny_model_dir):
    from peft import get_peft_model

    options = TrainingOptions(method="dpo", lora_rank=4, lora_dropout=0.05)
    model, peft_config, _ = training.load_for_training(str(tiny_model_dir), None, options)
    peft_model = get_peft_model(model, peft_config)
    peft_model.train()
    dropouts = lora_dropouts(peft_model)
    assert dropouts and use_bulk_random_dropout(peft_model) == len(dropouts)
    swapped = lora_dropouts(peft_model)
    assert all(type(d) is BulkRandomDropout and d.p == 0.05 and d.training for d in swapped)
    assert use_bulk_random_dropout(peft_model) == 0  # nothing left to swap


def test_the_cpu_trainer_trains_with_the_bulk_random_masks(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    options = TrainingOptions(
        method="dpo", batch_size=1, n_epochs=1, learning_rate=1e-2, lora_rank=4, lora_dropout=0.1
    )
    tokenizer = training.load_tokenizer(str(tiny_model_dir))
    model, peft_config, _ = training.load_for_training(str(tiny_model_dir), None, options)
    rows = verdict_pairs()
    trainer = training.build_trainer(options, model, tokenizer, rows, str(tmp_path), peft_config)
    dropouts = lora_dropouts(trainer.model)
    assert dropouts and all(type(d) is BulkRandomDropout and d.p == 0.1 for d in dropouts)
    calls = []
    for d in dropouts:
        d.register_forward_hook(lambda mod, args, out: calls.append(mod.training))
    trainer.train()
    assert calls and all(calls)  # the masks were drawn in training mode
