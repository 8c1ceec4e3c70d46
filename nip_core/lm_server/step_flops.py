"""Floating-point work of a LoRA DPO step, counted from the model's shapes and the batch's tokens.

A training step's speed means little alone: `bench/dpo_roofline.py` divides the work a step must
do by its wall time and compares that rate with the fastest matrix multiply the same cores reach
on the same shapes. The count is the work of the step as our trainer runs it:

- every transformer layer's projections (q, k, v, o, gate, up, down) and attention over the
  tokens the backbone sees: a pair's shared prompt once and each answer once
  (`shared_prefix`), or the prompt in both rows where it is not shared;
- the LoRA matrices of every projection (rank r: r x (in + out) multiply-adds a token each);
- the output layer (vocabulary x hidden) only at the positions whose next token is scored:
  each answer's tokens (TRL's fused head projects nothing else);
- the backward pass: the gradient of every activation (one forward's worth of the frozen
  matrices; the embedding and the frozen output layer get no weight gradient), the LoRA
  matrices' own gradients, and attention's backward at twice its forward. With
  `prompt_gradients` off the prompt runs forward only.

Elementwise work (norms, rotary, softmax, SiLU) is left out: it is a few percent of the multiply
work and runs far below the matrix rate, which is what the ratio is meant to show. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# multiply-add = 2 floating-point operations
_MAC = 2


@dataclass(frozen=True)
class ModelShapes:
    """The sizes of a decoder-only transformer that decide its matrix work."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, config: Any) -> ModelShapes:
        """From a transformers config (its text config where it has one)."""
        if hasattr(config, "get_text_config"):
            config = config.get_text_config()
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            hidden=config.hidden_size,
            intermediate=config.intermediate_size,
            layers=config.num_hidden_layers,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            vocab=config.vocab_size,
        )

    def projections(self) -> list[tuple[int, int]]:
        """(in, out) of each linear projection of one layer: q, k, v, o, gate, up, down."""
        h, m = self.hidden, self.intermediate
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [(h, q), (h, kv), (h, kv), (q, h), (h, m), (h, m), (m, h)]


def projection_flops(shapes: ModelShapes, tokens: int) -> float:
    """Forward work of every layer's frozen projections for `tokens` tokens."""
    per_token = sum(i * o for i, o in shapes.projections()) * shapes.layers
    return float(_MAC * per_token * tokens)


def lora_flops(shapes: ModelShapes, tokens: int, rank: int) -> float:
    """Forward work of rank-`rank` adapters on every projection for `tokens` tokens."""
    per_token = sum(rank * (i + o) for i, o in shapes.projections()) * shapes.layers
    return float(_MAC * per_token * tokens)


def attention_flops(shapes: ModelShapes, start: int, tokens: int) -> float:
    """Forward work of scores and weighted values for `tokens` new tokens after `start` earlier
    ones (causal: the token at position p attends to p + 1 positions)."""
    attended = tokens * start + tokens * (tokens + 1) / 2
    return float(_MAC * 2 * shapes.heads * shapes.head_dim * attended * shapes.layers)


def head_flops(shapes: ModelShapes, scored: int) -> float:
    """Forward work of the output layer at `scored` positions."""
    return float(_MAC * shapes.vocab * shapes.hidden * scored)


@dataclass(frozen=True)
class StepWork:
    """Forward and backward work of one optimizer step, in floating-point operations."""

    forward: float
    backward: float

    @property
    def total(self) -> float:
        return self.forward + self.backward

    def __add__(self, other: StepWork) -> StepWork:
        return StepWork(self.forward + other.forward, self.backward + other.backward)


def _segment(shapes: ModelShapes, start: int, tokens: int, rank: int) -> tuple[float, float, float]:
    """(frozen projections, LoRA, attention) forward work of `tokens` tokens after `start`."""
    return (
        projection_flops(shapes, tokens),
        lora_flops(shapes, tokens, rank),
        attention_flops(shapes, start, tokens),
    )


def dpo_pair_work(
    shapes: ModelShapes,
    prompt: int,
    chosen: int,
    rejected: int,
    *,
    lora_rank: int,
    shared_prompt: bool = True,
    prompt_gradients: bool = True,
) -> StepWork:
    """The work one preference pair adds to a training step (prompt and answers in tokens)."""
    prompt_runs = 1 if shared_prompt else 2
    forward = backward = 0.0
    frozen, lora, attention = _segment(shapes, 0, prompt, lora_rank)
    forward += prompt_runs * (frozen + lora + attention)
    if prompt_gradients:
        backward += prompt_runs * (frozen + 2 * lora + 2 * attention)
    for answer in (chosen, rejected):
        frozen, lora, attention = _segment(shapes, prompt, answer, lora_rank)
        head = head_flops(shapes, answer)
        forward += frozen + lora + attention + head
        backward += frozen + 2 * lora + 2 * attention + head
    return StepWork(forward, backward)


def dpo_step_work(
    shapes: ModelShapes,
    pairs: list[tuple[int, int, int]],
    *,
    lora_rank: int,
    shared_prompt: bool = True,
    prompt_gradients: bool = True,
) -> StepWork:
    """The work of a step over `pairs` ((prompt, chosen, rejected) tokens each)."""
    total = StepWork(0.0, 0.0)
    for prompt, chosen, rejected in pairs:
        total += dpo_pair_work(
            shapes,
            prompt,
            chosen,
            rejected,
            lora_rank=lora_rank,
            shared_prompt=shared_prompt,
            prompt_gradients=prompt_gradients,
        )
    return total
