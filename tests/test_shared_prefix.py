"""A DPO batch's shared prompt, run once, gives the same log-probs and gradients as run twice.

`shared_prefix.share_pair_prefixes` patches the backbone under TRL's fused LM head; these
tests compare it with the unpatched model on a tiny random Llama with a LoRA adapter: right
padding, pairs whose prompts differ in length, and calls it must leave alone.
"""

from __future__ import annotations

import functools
import logging

import pytest

from nip_core.lm_server import shared_prefix, training
from nip_core.lm_server.options import TrainingOptions
from tests.tiny_model import build_tiny_model

torch = pytest.importorskip("torch")
# The unpatched function: each recording patch wraps this, not a patch an earlier call left.
FORWARD_SHARING_PREFIX = shared_prefix._forward_sharing_prefix
FORWARD_PACKED = shared_prefix._forward_packed


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def _lora_model(path):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    add_fused_lm_head(model)
    options = TrainingOptions(method="dpo", lora_rank=4, lora_dropout=0.0)
    model = get_peft_model(model, training.lora_config(options))
    for name, param in model.named_parameters():  # LoRA B starts at zero: give it a value
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    return model.train()


def _pair_batch():
    """Two pairs, [chosen 0, chosen 1, rejected 0, rejected 1], right-padded: prompts of 20
    and 23 tokens, answers of 3-5 tokens."""
    generator = torch.Generator().manual_seed(1)
    rows, prompts = [], []
    for prompt_len in (20, 23):
        prompts.append(torch.randint(5, 500, (prompt_len,), generator=generator))
    answers = [torch.randint(5, 500, (n,), generator=generator) for n in (3, 5, 4, 3)]
    rows = [torch.cat([prompts[i % 2], answers[i]]) for i in range(4)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(4, width, dtype=torch.long)
    mask = torch.zeros(4, width, dtype=torch.long)
    completion = torch.zeros(4, width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
        completion[i, len(prompts[i % 2]) : len(row)] = 1
    labels = ids.masked_fill(completion == 0, -100)
    return ids, mask, labels


def _log_probs_and_lora_grads(model, ids, mask, labels):
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    out.log_probs.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.log_probs.detach(), grads


def test_pair_shared_lengths_count_real_common_tokens():
    ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 9, 9], [1, 2, 3, 4, 6], [1, 2, 7, 9, 9]])
    lengths = shared_prefix.pair_shared_lengths
    assert lengths(ids, None).tolist() == [4, 2]  # rows 0/2 share 4, rows 1/3 share 2
    mask = torch.ones_like(ids)
    mask[0, 3:] = 0  # padding never counts as shared
    assert lengths(ids, mask).tolist() == [3, 2]
    assert lengths(ids[:3], None) is None  # not two halves
    same = torch.tensor([[1, 2, 3], [1, 2, 3]])
    assert lengths(same, None).tolist() == [2]  # one position left for the second call


def test_packed_layout_puts_each_pair_in_one_row_and_reads_every_row_back():
    # pair 0: prompt [1 2 3], chosen [4 5], rejected [6]; pair 1: prompt [7 8], chosen [9],
    # rejected [10 11 12]; rows right-padded with 0
    ids = torch.tensor([[1, 2, 3, 4, 5], [7, 8, 9, 0, 0], [1, 2, 3, 6, 0], [7, 8, 10, 11, 12]])
    mask = (ids != 0).long()
    lengths = torch.tensor([3, 2])
    rows, columns, positions, segments, back = shared_prefix.packed_layout(mask, lengths)
    assert ids[rows, columns].tolist() == [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]
    assert positions.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 2, 3, 4]]
    assert segments.tolist() == [[0, 0, 0, 1, 1, 2], [0, 0, 1, 2, 2, 2]]
    packed = ids[rows, columns].reshape(-1)
    real = mask.bool()
    assert torch.equal(packed[back][real], ids[real])  # every real token read back in place

    mask_rows = shared_prefix.packed_attention_mask(segments, "bool", torch.float32)[:, 0]
    # The rejected answer of pair 0 sees its prompt and itself, not the chosen answer.
    assert mask_rows[0, 5].tolist() == [True, True, True, False, False, True]
    assert mask_rows[1, 3].tolist() == [True, True, False, True, False, False]
    additive = shared_prefix.packed_attention_mask(segments, "additive", torch.bfloat16)
    assert additive.dtype == torch.bfloat16
    assert torch.equal(additive[:, 0] == 0, mask_rows)


def test_a_pair_padded_past_its_packed_row_sees_only_its_prompt_and_padding():
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 0, 0], [1, 2, 3, 5], [1, 2, 9, 0]])
    _, _, _, segments, _ = shared_prefix.packed_layout((ids != 0).long(), torch.tensor([3, 2]))
    assert segments.tolist() == [[0, 0, 0, 1, 2], [0, 0, 2, 3, 3]]
    allowed = shared_prefix.packed_attention_mask(segments, "bool", torch.float32)[1, 0]
    assert allowed[:3, 3:].sum() == 0  # no real token sees padding
    assert allowed[4].tolist() == [True, True, False, True, True]


@pytest.mark.parametrize(("pack", "attention"), [(True, "sdpa"), (True, "eager"), (False, "sdpa")])
def test_sharing_the_prompt_gives_the_same_log_probs_and_gradients(
    tiny_model_dir, monkeypatch, pack, attention
):
    monkeypatch.setattr(shared_prefix, "MIN_SHARED_TOKENS", 4)
    ids, mask, labels = _pair_batch()
    model = _lora_model(tiny_model_dir)
    model.set_attn_implementation(attention)
    expected, expected_grads = _log_probs_and_lora_grads(model, ids, mask, labels)

    backbone = shared_prefix.transformer_backbone(model)
    assert shared_prefix.packing_mask_kind(backbone) == shared_prefix.PACKING_MASKS[attention]
    calls = []
    original = backbone.forward
    backbone.forward = lambda **kw: calls.append(kw["input_ids"].shape) or original(**kw)
    assert shared_prefix.share_pair_prefixes(backbone, pack=pack)
    assert not shared_prefix.share_pair_prefixes(backbone)  # patched once
    shared, grads = _log_probs_and_lora_grads(model, ids, mask, labels)

    if pack:  # one row a pair: prompt, chosen, rejected (20 + 3 + 4 and 23 + 5 + 3 tokens)
        assert calls == [(2, 31)]
    else:  # each pair's prompt once (20 and 23 tokens), then each row's remainder (3-5 tokens)
        assert calls == [(2, 23), (4, 5)]
    assert torch.allclose(shared, expected, atol=1e-5)
    assert (shared != 0).sum() == (labels[:, 1:] != -100).sum()
    assert expected_grads.keys() == grads.keys() and any("lora_A" in n for n in grads)
    for name, grad in expected_grads.items():
        assert torch.allclose(grads[name], grad, atol=1e-5, rtol=1e-4), name


def test_other_calls_go_through_unchanged(tiny_model_dir):
    model = _lora_model(tiny_model_dir)
    backbone = shared_prefix.transformer_backbone(model)
    calls = []
    original = backbone.forward
    backbone.forward = lambda **kw: calls.append(kw["input_ids"].shape) or original(**kw)
    shared_prefix.share_pair_prefixes(backbone)
    ids, mask, labels = _pair_batch()
    model(input_ids=ids[:3], attention_mask=mask[:3], labels=labels[:3], fused_lm_head=True)
    assert calls == [ids[:3].shape]  # an odd batch is not pairs
    with torch.no_grad():
        model.generate(input_ids=ids[:1, :8], max_new_tokens=2, do_sample=False)
    assert all(shape[0] == 1 for shape in calls[1:])  # generation keeps its own cache


class _Cache:
    """Only the length a backbone's cache reports."""

    def __init__(self, length: int):
        self.length = length

    def get_seq_length(self) -> int:
        return self.length

    def reorder_cache(self, rows) -> None:
        pass


class _TakesNoCache(torch.nn.Module):
    """A backbone whose forward names neither `cache` nor `past_key_values`; records each call."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(500, 8)
        self.calls = []

    def forward(self, input_ids=None, attention_mask=None, use_cache=None, **kwargs):
        from transformers.modeling_outputs import BaseModelOutputWithPast

        self.calls.append(tuple(input_ids.shape))
        cache = _Cache(input_ids.shape[1]) if use_cache else None
        hidden = self.embed(input_ids).cumsum(dim=1)
        return BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=cache)


class _IgnoresItsCache(_TakesNoCache):
    """Declares `past_key_values` and returns a prompt's cache, but never attends with it."""

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, **kwargs):
        return super().forward(input_ids, attention_mask, **kwargs)


@pytest.mark.parametrize("backbone_type", [_TakesNoCache, _IgnoresItsCache])
def test_a_backbone_that_cannot_share_runs_the_plain_call_and_warns_once(backbone_type, caplog):
    torch.manual_seed(0)
    backbone = backbone_type()
    ids, mask, _ = _pair_batch()
    expected = backbone(input_ids=ids, attention_mask=mask).last_hidden_state
    backbone.calls.clear()
    with caplog.at_level(logging.WARNING, logger=shared_prefix.__name__):
        assert shared_prefix.share_pair_prefixes(backbone)
        outputs = [backbone(input_ids=ids, attention_mask=mask).last_hidden_state for _ in "ab"]

    for output in outputs:
        assert torch.equal(output, expected)
    tried = [(2, 23), (4, 5)] if backbone_type is _IgnoresItsCache else []
    assert backbone.calls == tried + [tuple(ids.shape)] * 2  # tried at most once
    warnings = [r for r in caplog.records if r.name == shared_prefix.__name__]
    assert len(warnings) == 1 and "prompt twice" in warnings[0].getMessage()


def _recording_first_layer(backbone) -> list:
    """Each call's hidden states after the first layer (LoRA's), kept with their gradients:
    where a backward pass reaches."""

    def keep(module, args, out):
        hidden = out[0] if isinstance(out, tuple) else out
        if hidden.requires_grad:
            hidden.retain_grad()
        states.append(hidden)

    states = []
    backbone.layers[0].register_forward_hook(keep)
    return states


def test_a_frozen_prompt_gives_the_same_log_probs_and_trains_through_the_answers_only(
    tiny_model_dir, monkeypatch
):
    monkeypatch.setattr(shared_prefix, "MIN_SHARED_TOKENS", 4)
    ids, mask, labels = _pair_batch()
    runs = {}
    for prompt_gradients in (True, False):
        model = _lora_model(tiny_model_dir)  # the same weights each time
        if prompt_gradients:
            expected, _ = _log_probs_and_lora_grads(model, ids, mask, labels)
        backbone = shared_prefix.transformer_backbone(model)
        calls, original = [], backbone.forward
        backbone.forward = lambda _o=original, _c=calls, **kw: (
            _c.append(kw["input_ids"].shape) or _o(**kw)
        )
        states = _recording_first_layer(backbone)
        # Both through the prompt's cache, the trained prompt not packed with its answers.
        share = functools.partial(shared_prefix.share_pair_prefixes, pack=False)
        assert share(backbone, prompt_gradients=prompt_gradients)
        runs[prompt_gradients] = (
            *_log_probs_and_lora_grads(model, ids, mask, labels),
            calls,
            states,
        )

    trained, trained_grads, trained_calls, trained_states = runs[True]
    frozen, grads, calls, states = runs[False]
    assert trained_calls == [(2, 23), (4, 5)]
    prompt_grads = trained_states[0].grad.abs().sum(dim=-1)
    assert prompt_grads[0, :20].gt(0).all() and prompt_grads[1].gt(0).all()  # the prompts train
    assert prompt_grads[0, 20:].eq(0).all()  # the shorter prompt's padding does not
    # Frozen, each prompt's last token (20th, 23rd) runs with the answers: it predicts their first.
    assert calls == [(2, 22), (4, 6)]
    assert torch.allclose(frozen, expected, atol=1e-5)
    assert torch.allclose(trained, expected, atol=1e-5)
    assert not states[0].requires_grad  # no gradient reaches the 19 frozen positions
    assert states[1].grad[:, 0].abs().sum(dim=-1).gt(0).all()  # the 20th is in the graph
    lora = [name for name in grads if "lora_" in name]
    assert len(lora) == len([n for n in trained_grads if "lora_" in n]) > 0
    assert all(grads[name].abs().sum() > 0 for name in lora)  # every layer trains on the answers
    assert not all(torch.allclose(grads[n], trained_grads[n], atol=1e-6) for n in lora)


def _train_log(
    tiny_model_dir,
    tmp_path,
    share: bool,
    monkeypatch,
    prompt_gradients: bool = True,
    batch_size: int = 1,
    pack: bool = False,
) -> tuple[list[dict], list[tuple[list[int], bool]]]:
    """The trainer's loss log and (each pair's shared positions, frozen or "packed") of each
    shared call."""
    monkeypatch.setattr(training, "SHARE_PAIR_PROMPTS", share)
    monkeypatch.setattr(training, "PACK_PAIR_ANSWERS", pack)
    shared_calls = []
    monkeypatch.setattr(
        shared_prefix,
        "_forward_sharing_prefix",
        lambda *args: (
            shared_calls.append((args[3].tolist(), args[6])) or FORWARD_SHARING_PREFIX(*args)
        ),
    )
    monkeypatch.setattr(
        shared_prefix,
        "_forward_packed",
        lambda *args: shared_calls.append((args[3].tolist(), "packed")) or FORWARD_PACKED(*args),
    )
    torch.manual_seed(0)
    options = TrainingOptions(
        method="dpo",
        batch_size=batch_size,
        n_epochs=2,
        learning_rate=1e-3,
        lora_dropout=0.0,
        prompt_gradients=prompt_gradients,
        precision="fp32",  # the same sums either way; bf16 rounds them by the batch's shape
    )
    tokenizer = training.load_tokenizer(str(tiny_model_dir))
    model, peft_config, _ = training.load_for_training(str(tiny_model_dir), None, options)
    question = "Is this function correct? def add(a, b): return a - b  # adds two numbers"
    rows = [
        {
            # prompts of their own lengths: a batch of both pairs pads the shorter one
            "prompt": [{"role": "user", "content": f"{question} (case {i}{' again' * 3 * i})"}],
            "chosen": [{"role": "assistant", "content": "Decision: reject"}],
            "rejected": [{"role": "assistant", "content": "Decision: accept"}],
        }
        for i in range(2)
    ]
    trainer = training.build_trainer(
        options, model, tokenizer, rows, str(tmp_path / str(share)), peft_config
    )
    backbone = shared_prefix.transformer_backbone(trainer.model)
    assert getattr(backbone.forward, "shares_pair_prefixes", False) is share
    assert not trainer.args.gradient_checkpointing
    trainer.train()
    return [entry for entry in trainer.state.log_history if "loss" in entry], shared_calls


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "cached"])
@pytest.mark.parametrize("batch_size", [1, 2])
def test_dpo_trainer_trains_the_same_with_the_prompt_shared(
    tiny_model_dir, tmp_path, monkeypatch, batch_size, pack
):
    """TRL's whole step (precomputed reference, loss, margins) matches the duplicated batch,
    one pair a batch or both, their prompts of different lengths, each pair packed in one row
    or its answers run after its prompt through the prompt's cache."""
    args = (tiny_model_dir, tmp_path, False, monkeypatch, True, batch_size)
    unshared, unshared_calls = _train_log(*args)
    shared, shared_calls = _train_log(tiny_model_dir, tmp_path, True, *args[3:], pack=pack)
    assert unshared_calls == []
    steps = 4 // batch_size
    # the reference's pass over both pairs, then the steps; each call shares every pair's prompt
    assert len(shared_calls) == 2 // batch_size + steps
    assert all(len(lengths) == batch_size for lengths, _ in shared_calls)
    assert {how for _, how in shared_calls} == {"packed" if pack else False}
    if batch_size == 2:
        assert len(set(shared_calls[0][0])) == 2  # prompts of their own lengths, one call
    assert len(shared) == len(unshared) == steps
    for ours, theirs in zip(shared, unshared, strict=True):
        for key in ("loss", "rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-5), key


def test_dpo_trainer_with_a_frozen_prompt_starts_alike_and_trains_otherwise(
    tiny_model_dir, tmp_path, monkeypatch
):
    shared, shared_calls = _train_log(tiny_model_dir, tmp_path, True, monkeypatch)
    frozen, frozen_calls = _train_log(tiny_model_dir, tmp_path / "f", True, monkeypatch, False)
    # The reference's pass runs without gradients anyway; the steps freeze all but the last
    # shared position.
    assert [f for _, f in frozen_calls] == [False] * 2 + [True] * 4
    assert [n for n, _ in frozen_calls] == [n for n, _ in shared_calls[:2]] + [
        [length - 1 for length in n] for n, _ in shared_calls[2:]
    ]
    assert len(frozen) == len(shared) == 4
    assert frozen[0]["loss"] == pytest.approx(shared[0]["loss"], rel=1e-5)  # the same first step
    assert frozen[-1]["loss"] != pytest.approx(shared[-1]["loss"], rel=1e-4)  # other updates


@pytest.mark.parametrize(
    ("attention", "sliding_window", "kind"),
    [("sdpa", None, "bool"), ("eager", None, "additive"), ("sdpa", 64, None), ("flex", None, None)],
)
def test_only_a_backbone_that_reads_a_4d_mask_as_given_packs(attention, sliding_window, kind):
    """A sliding window or another attention builds its own mask: those pairs go through the
    prompt's cache instead."""
    from types import SimpleNamespace

    backbone = torch.nn.Module()
    backbone.config = SimpleNamespace(_attn_implementation=attention, sliding_window=sliding_window)
    assert shared_prefix.packing_mask_kind(backbone) == kind
