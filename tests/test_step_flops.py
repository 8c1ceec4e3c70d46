"""The work of a LoRA DPO step, counted from the model's shapes (the roofline bench's numerator)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nip_core.lm_server.step_flops import (
    ModelShapes,
    attention_flops,
    dpo_pair_work,
    dpo_step_work,
    head_flops,
    lora_flops,
    projection_flops,
)

# SmolLM2-135M-Instruct's config, as the embedded model ships it
SMOLLM2 = SimpleNamespace(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    vocab_size=49152,
)


@pytest.fixture
def shapes() -> ModelShapes:
    return ModelShapes.from_config(SMOLLM2)


def test_projections_hold_the_model_s_matrix_parameters(shapes):
    per_layer = sum(i * o for i, o in shapes.projections())
    # 134.5 M parameters, 28.3 M of them the tied embedding and output layer: the rest are the
    # layers' projections (the norms' 576-wide vectors aside)
    assert per_layer * shapes.layers == 106_168_320
    assert projection_flops(shapes, 10) == 2 * 106_168_320 * 10
    assert head_flops(shapes, 3) == 2 * 49152 * 576 * 3


def test_shapes_fall_back_to_the_usual_defaults():
    plain = SimpleNamespace(**{**vars(SMOLLM2), "head_dim": None})
    del plain.num_key_value_heads
    shapes = ModelShapes.from_config(plain)
    assert (shapes.head_dim, shapes.kv_heads) == (64, 9)


def test_attention_counts_each_causal_pair_once(shapes):
    def brute(start, tokens):
        attended = sum(start + t + 1 for t in range(tokens))
        return 2 * 2 * shapes.heads * shapes.head_dim * attended * shapes.layers

    for start, tokens in [(0, 1), (0, 7), (5, 3), (347, 8)]:
        assert attention_flops(shapes, start, tokens) == brute(start, tokens)


def test_lora_is_rank_times_both_sides_of_every_projection(shapes):
    sides = sum(i + o for i, o in shapes.projections())
    assert lora_flops(shapes, 4, rank=16) == 2 * 16 * sides * shapes.layers * 4


def test_a_pair_runs_its_prompt_once_and_both_answers(shapes):
    work = dpo_pair_work(shapes, 300, 5, 7, lora_rank=16)
    frozen = projection_flops(shapes, 300 + 5 + 7)
    lora = lora_flops(shapes, 300 + 5 + 7, 16)
    attention = (
        attention_flops(shapes, 0, 300)
        + attention_flops(shapes, 300, 5)
        + attention_flops(shapes, 300, 7)
    )
    head = head_flops(shapes, 5 + 7)
    assert work.forward == pytest.approx(frozen + lora + attention + head)
    # activations' gradients through the frozen matrices, LoRA's and attention's at twice
    assert work.backward == pytest.approx(frozen + 2 * lora + 2 * attention + head)


def test_an_unshared_prompt_runs_twice_and_a_frozen_one_has_no_backward(shapes):
    shared = dpo_pair_work(shapes, 300, 5, 5, lora_rank=8)
    duplicated = dpo_pair_work(shapes, 300, 5, 5, lora_rank=8, shared_prompt=False)
    prompt = dpo_pair_work(shapes, 300, 0, 0, lora_rank=8)
    assert duplicated.total == pytest.approx(shared.total + prompt.total)
    frozen = dpo_pair_work(shapes, 300, 5, 5, lora_rank=8, prompt_gradients=False)
    assert frozen.forward == shared.forward
    assert frozen.backward == pytest.approx(shared.backward - prompt.backward)


def test_a_step_sums_its_pairs(shapes):
    pairs = [(300, 5, 7), (350, 6, 6)]
    step = dpo_step_work(shapes, pairs, lora_rank=16)
    each = [dpo_pair_work(shapes, *p, lora_rank=16) for p in pairs]
    assert step.total == pytest.approx(sum(w.total for w in each))
    # the recipe's step (2 pairs of ~350 prompt tokens) is a few hundred GFLOP
    assert 2e11 < step.total < 5e11
