"""Seeded sampling noise for the transformers engine, drawn on the model's device.

Every generated sequence samples from a stream of its own: the uniform for vocabulary entry `i`
at decode step `t` of a sequence seeded `s` is a counter-based integer hash of (s, t, i), so it
depends on nothing else (not on the batch the sequence shares, nor on the device: integer
arithmetic is exact on CPU and CUDA alike) and is computed for the whole batch at once with a
few torch integer ops where the logits live. Gumbel noise from those uniforms, added to the
tempered (and top-p filtered) scores, makes the argmax an exact draw from the softmax (the
Gumbel-max trick), so each sequence's tokens depend only on its seed and its own scores.

The hash is lowbias32 (C. Wellons, "Prospecting for hash functions", 2018) on int64 tensors
that hold unsigned 32-bit values. Each 32-bit product is taken with the multiplier's signed
32-bit form, so it stays within int64 (|x * c| < 2^63: no overflow on any device) and its low 32
bits are those of the unsigned product. A pure-Python copy of the same arithmetic lives in
`tests/test_hf_noise.py` and must agree with this one bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MASK32 = 0xFFFFFFFF
_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)  # lowbias32's two multipliers
_START = 0x6A09E667  # the hash state before the seed is absorbed (any odd constant)
_OFFSET = 0x9E3779B9  # added to every absorbed word, so that zeros hash to non-zero


def _signed32(value: int) -> int:
    """`value` (a uint32) as a signed 32-bit number: the same low 32 bits of any product."""
    return value - (1 << 32) if value >= 1 << 31 else value


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of each element (int64 tensor of values in [0, 2^32))."""
    first, second = (_signed32(m) for m in _MULTIPLIERS)
    x = x ^ (x >> 16)  # a new tensor: the in-place steps below leave the input alone
    x.mul_(first).bitwise_and_(MASK32)
    x ^= x >> 15
    x.mul_(second).bitwise_and_(MASK32)
    x ^= x >> 16
    return x


def absorb(state: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
    """The hash state after taking in one more 32-bit word (broadcasting state and word)."""
    return mix32(state ^ ((word + _OFFSET) & MASK32))


def seed_words(seeds: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Low and high 32-bit halves of each (63-bit, non-negative) sequence seed, on `device`."""
    import torch

    values = torch.tensor(seeds, dtype=torch.int64)
    return (values & MASK32).to(device), (values >> 32).to(device)


def row_keys(seed_low: torch.Tensor, seed_high: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per sequence for its decode step `step` (all int64 tensors of shape [B])."""
    import torch

    start = torch.full_like(seed_low, _START)
    return absorb(absorb(absorb(start, seed_low), seed_high), step)


def uniforms(keys: torch.Tensor, vocabulary: int) -> torch.Tensor:
    """[B, vocabulary] float32 uniforms in (0, 1): the top 24 bits of absorb(key, index), made
    odd (so never 0 or 1), times 2^-24, every value exactly representable in float32."""
    import torch

    index = torch.arange(vocabulary, device=keys.device, dtype=torch.int64)
    bits = absorb(keys[:, None], index[None, :])
    return ((bits >> 8) | 1).to(torch.float32) * 2.0**-24


def gumbel_noise(keys: torch.Tensor, vocabulary: int) -> torch.Tensor:
    """Standard Gumbel noise, -log(-log(u)), for every (sequence, vocabulary entry)."""
    noise = uniforms(keys, vocabulary)
    return noise.log_().neg_().log_().neg_()


def top_p_filtered(scores: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Scores with each row's tail beyond its nucleus masked out: the most likely tokens are
    kept until their mass reaches the row's `top_p`, the one that crosses it included. Rows with
    top_p >= 1 are left untouched."""
    import torch

    threshold = torch.where(top_p < 1.0, top_p, torch.inf)[:, None]
    ordered, order = torch.sort(scores, descending=True, dim=-1)
    probabilities = ordered.softmax(-1)
    drop_sorted = probabilities.cumsum(-1) - probabilities >= threshold
    return scores.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), -torch.inf)


def penalised(
    scores: torch.Tensor, penalty: torch.Tensor, tokens: torch.Tensor, real: torch.Tensor
) -> torch.Tensor:
    """The repetition penalty (CTRL's, as transformers applies it) per row: the score of every
    token the row has seen (`tokens` where `real`, padding excluded) is divided by the row's
    penalty when positive and multiplied when negative."""
    import torch

    seen = torch.zeros_like(scores).scatter_add_(1, tokens, real.to(scores.dtype)) > 0
    factor = penalty[:, None]
    changed = torch.where(scores < 0, scores * factor, scores / factor)
    return torch.where(seen, changed, scores)


def next_tokens(
    logits: torch.Tensor,
    keys: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    *,
    greedy: bool = False,
    nucleus: bool = True,
) -> torch.Tensor:
    """One token per row: argmax of the scores (rows with temperature 0), or of the tempered,
    top-p filtered scores plus the row's seeded Gumbel noise (an exact softmax draw).

    `greedy` (every row has temperature 0) and `nucleus` (some row has top_p < 1) let the
    caller skip work it knows is not needed without reading the tensors back from the device.
    """
    import torch

    scores = logits.float()
    if greedy:
        return scores.argmax(-1)
    cold = temperature <= 0
    scores = scores / torch.where(cold, 1.0, temperature)[:, None]
    if nucleus:
        scores = top_p_filtered(scores, torch.where(cold, 1.0, top_p))
    noisy = scores + gumbel_noise(keys, scores.shape[-1])
    return torch.where(cold, scores.argmax(-1), noisy.argmax(-1))
