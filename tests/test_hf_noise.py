"""The transformers engine's seeded sampling noise (`hf_noise`): a pure function of (sequence
seed, decode step, vocabulary index), equal bit for bit to a pure-Python copy of the same
integer hash (so any device computing exact integer arithmetic draws the same uniforms), and
sampling from the softmax whatever its neighbours in the batch ask for.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from nip_core.lm_server.engines import hf_noise  # noqa: E402

M32 = 0xFFFFFFFF


def lowbias32(x: int) -> int:
    """C. Wellons' lowbias32 on Python integers (unsigned 32-bit arithmetic)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def absorb(state: int, word: int) -> int:
    return lowbias32(state ^ ((word + 0x9E3779B9) & M32))


def reference_uniform(seed: int, step: int, index: int) -> float:
    """The uniform of vocabulary entry `index` at decode step `step` of a sequence seeded
    `seed`: key = absorb(absorb(absorb(START, low word), high word), step), then the top 24
    bits of absorb(key, index), made odd, times 2^-24."""
    key = absorb(absorb(absorb(0x6A09E667, seed & M32), seed >> 32), step)
    return ((absorb(key, index) >> 8) | 1) * 2.0**-24


def uniforms(seeds: list[int], steps: list[int], vocabulary: int) -> torch.Tensor:
    low, high = hf_noise.seed_words(seeds, "cpu")
    keys = hf_noise.row_keys(low, high, torch.tensor(steps, dtype=torch.int64))
    return hf_noise.uniforms(keys, vocabulary)


def test_mix32_is_lowbias32_on_the_whole_32_bit_range():
    values = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xDEADBEEF, M32]
    values += [random.Random(5).getrandbits(32) for _ in range(200)]
    hashed = hf_noise.mix32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert hashed == [lowbias32(v) for v in values]


def test_uniforms_equal_the_pure_python_reference_exactly():
    rng = random.Random(11)
    seeds = [0, 1, 7, 2**32 - 1, 2**32, 2**63 - 1] + [rng.getrandbits(63) for _ in range(10)]
    steps = [0, 1, 5, 31, 1000, 32_767] + [rng.randrange(5000) for _ in range(10)]
    vocabulary = 300
    values = uniforms(seeds, steps, vocabulary)
    assert values.dtype == torch.float32
    expected = [
        [reference_uniform(seed, step, i) for i in range(vocabulary)]
        for seed, step in zip(seeds, steps, strict=True)
    ]
    # Every expected value has 24 significant bits, so float32 holds it exactly.
    assert values.double().tolist() == expected
    assert 0.0 < float(values.min()) and float(values.max()) < 1.0


def test_noise_depends_only_on_seed_step_and_index():
    """The same (seed, step) row gives the same values in any batch, order or vocabulary size,
    and changing any one of the three changes them."""
    rows = [(3, 0), (3, 1), (4, 0), (2**40 + 3, 0)]
    together = uniforms([s for s, _ in rows], [t for _, t in rows], 64)
    for position, (seed, step) in enumerate(rows):
        alone = uniforms([seed], [step], 64)[0]
        assert torch.equal(alone, together[position])
        assert torch.equal(uniforms([9, seed, 9], [2, step, 2], 128)[1, :64], alone)
    assert len({tuple(row.tolist()) for row in together}) == len(rows)
    assert len(set(together[0].tolist())) > 60  # indices within a row differ too
    # The mean and spread of many uniforms are those of U(0, 1).
    many = uniforms(list(range(64)), [0] * 64, 4096)
    assert abs(float(many.mean()) - 0.5) < 0.005
    assert abs(float(many.var()) - 1 / 12) < 0.002


def _draws(logits: torch.Tensor, count: int, temperature=1.0, top_p=1.0) -> torch.Tensor:
    rows = logits.expand(count, -1)
    low, high = hf_noise.seed_words(list(range(count)), "cpu")
    keys = hf_noise.row_keys(low, high, torch.zeros(count, dtype=torch.int64))
    return hf_noise.next_tokens(
        rows, keys, torch.full((count,), temperature), torch.full((count,), top_p)
    )


def test_next_tokens_draw_from_the_tempered_softmax_and_its_nucleus():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    frequencies = torch.bincount(_draws(logits, 8000), minlength=4) / 8000
    assert torch.allclose(frequencies, logits.softmax(-1)[0], atol=0.02)
    cold = torch.bincount(_draws(logits, 8000, temperature=0.5), minlength=4) / 8000
    assert torch.allclose(cold, (logits / 0.5).softmax(-1)[0], atol=0.02)
    # p = .64, .24, .09, .03: top-p 0.7 keeps the two most likely (the second crosses 0.7)
    assert set(_draws(logits, 500, top_p=0.7).tolist()) == {0, 1}
    assert set(_draws(logits, 500, top_p=0.5).tolist()) == {0}


def test_a_rows_token_does_not_depend_on_its_neighbours_settings():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=generator)
    low, high = hf_noise.seed_words([10, 11, 12, 13, 14, 15], "cpu")
    keys = hf_noise.row_keys(low, high, torch.tensor([0, 3, 1, 0, 7, 2]))
    temperature = torch.tensor([1.0, 0.0, 0.7, 1.3, 1.0, 0.0])
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.5, 1.0, 0.3])
    batched = hf_noise.next_tokens(logits, keys, temperature, top_p)
    for row in range(6):
        alone = hf_noise.next_tokens(
            logits[row : row + 1],
            keys[row : row + 1],
            temperature[row : row + 1],
            top_p[row : row + 1],
            greedy=bool(temperature[row] == 0),
            nucleus=bool(top_p[row] < 1),
        )
        assert int(alone) == int(batched[row])
    assert batched[1] == logits[1].argmax() and batched[5] == logits[5].argmax()


def test_repetition_penalty_matches_transformers_and_skips_padding():
    from transformers import RepetitionPenaltyLogitsProcessor

    scores = torch.tensor([[1.0, -2.0, 3.0, 0.5], [1.0, -2.0, 3.0, 0.5]])
    tokens = torch.tensor([[0, 0, 1, 2], [0, 3, 3, 3]])
    real = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])  # row 1 starts with one padding token
    ours = hf_noise.penalised(scores, torch.tensor([1.5, 2.0]), tokens, real)
    theirs = RepetitionPenaltyLogitsProcessor(1.5)(tokens[:1], scores[:1].clone())
    assert torch.allclose(ours[0], theirs[0])
    assert ours[1].tolist() == [1.0, -2.0, 3.0, 0.25]  # token 0 there was padding only
