"""TRL's fused LM head, made to score only labelled positions on CPU, still gives exact log-probs.

TRL only exercises its compact path on CUDA; `training.score_only_labelled_positions` turns it on
for CPU, where the torch tile fold then sees gathered rows. These tests compare log-probs and
gradients with a plain `log_softmax` over the full logits of a tiny random Llama.
"""

from __future__ import annotations

import pytest

from nip_core.lm_server import training
from nip_core.lm_server.options import TrainingOptions
from tests.tiny_model import build_tiny_model

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def _model_with_fused_head(path):
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    return model


def _batch():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 500, (3, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[2, 9:] = 0  # a padded row
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :5] = -100  # prompt positions
    return ids, mask, labels


def _plain_log_probs(model, ids, mask, labels):
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    targets = labels[:, 1:]
    picked = logits.log_softmax(-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return picked.masked_fill(targets == -100, 0.0)


def test_patch_turns_compact_scoring_on_for_cpu_once(tiny_model_dir):
    import trl.trainer.utils as trl_utils

    training.score_only_labelled_positions()
    first = trl_utils._use_triton
    training.score_only_labelled_positions()
    assert trl_utils._use_triton is first  # idempotent: not wrapped twice
    assert first(torch.device("cpu")) is True
    assert first(torch.device("meta")) is False


def test_compact_scoring_matches_full_log_softmax_and_its_gradient(tiny_model_dir):
    training.score_only_labelled_positions()
    ids, mask, labels = _batch()
    model = _model_with_fused_head(tiny_model_dir)
    fused = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    expected = _plain_log_probs(model, ids, mask, labels)
    assert torch.allclose(fused.log_probs, expected, atol=1e-5)
    assert (fused.log_probs[:, :4] == 0).all() and (fused.log_probs[2, 8:] == 0).all()

    weights = model.model.layers[0].mlp.down_proj.weight
    fused.log_probs.sum().backward()
    fused_grad = weights.grad.clone()
    model.zero_grad()
    expected.sum().backward()
    assert torch.allclose(fused_grad, weights.grad, atol=1e-5, rtol=1e-4)


def test_cpu_trainer_gets_the_patch(tiny_model_dir, tmp_path):
    import trl.trainer.utils as trl_utils

    options = TrainingOptions(method="dpo", batch_size=1, n_epochs=1, learning_rate=1e-3)
    tokenizer = training.load_tokenizer(str(tiny_model_dir))
    model, peft_config, _ = training.load_for_training(str(tiny_model_dir), None, options)
    rows = [
        {
            "prompt": [{"role": "user", "content": "Is 2+2=4?"}],
            "chosen": [{"role": "assistant", "content": "Yes."}],
            "rejected": [{"role": "assistant", "content": "No."}],
        }
    ]
    training.build_trainer(options, model, tokenizer, rows, str(tmp_path), peft_config)
    assert trl_utils._use_triton(torch.device("cpu")) is True
