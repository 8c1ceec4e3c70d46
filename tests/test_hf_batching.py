"""The transformers engine's batching: which waiting requests join the running batch, batch
limits from the device or the command line, and on a tiny model that a seeded request answers
the same alone, batched with requests of other n / temperature / top-p, or joining a batch
between its decode steps; batched scoring equals scoring one conversation at a time.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from nip_core.lm_server.__main__ import _parse, hf_options
from nip_core.lm_server.engines.base import ChatRequest
from nip_core.lm_server.engines.hf_batching import (
    CPU_MAX_SEQUENCES,
    CPU_MAX_TOKENS,
    SWITCH_WINDOW_SECONDS,
    Load,
    admitted,
    candidates,
    device_limits,
    kv_bytes_per_token,
    prefill_groups,
)
from nip_core.lm_server.engines.hf_scoring import score_batches
from tests.tiny_model import build_tiny_model


def test_admission_is_first_come_first_served_within_both_limits():
    # (sequences, prompt tokens, new tokens); limits 6 sequences, 400 tokens
    jobs = [(1, 10, 10), (4, 20, 10), (1, 40, 10), (1, 50, 10), (1, 5, 10)]
    # 1+4+1 = 6 sequences x (40 + 10) = 300 tokens; a 7th sequence is over: stop there
    assert admitted(jobs, Load(), 6, 400) == 3
    # a running batch of 2 sequences, 100 wide, 50 new tokens to come: 3 x 150 = 450 > 400
    assert admitted(jobs, Load(2, 100, 50), 6, 400) == 0
    assert admitted(jobs, Load(2, 100, 20), 6, 400) == 1  # 3 x 120 = 360
    assert admitted([(3, 900, 100)], Load(), 2, 400) == 1  # an empty batch takes any one job


def test_candidates_keep_a_batch_to_its_model_and_let_other_models_wait_their_turn():
    def job(model: str, arrived: float):
        return SimpleNamespace(request=SimpleNamespace(model=model), arrived=arrived)

    late = 1.0 + SWITCH_WINDOW_SECONDS + 0.1
    pending = [job("a", 0.0), job("b", 1.0), job("a", 1.2), job("a", late)]
    assert candidates(pending, "a") == pending[:3:2]  # the late "a" waits for "b"'s batch
    assert candidates(pending[1:], "b") == [pending[1]]  # once the first "a" is served
    assert candidates(pending[:1], "a") == pending[:1]


def test_prefill_and_score_groups_stay_within_their_budgets():
    assert prefill_groups([10, 20, 30, 500, 40], budget=100) == [[0, 1, 2], [3], [4]]
    # (tokens, scored tokens); 100 padded tokens, logits of 1000-word vocabulary
    shapes = [(30, 2), (10, 1), (40, 3), (200, 5), (35, 2)]
    # by length: 10, 30 (2 x 30 <= 100); 35, 40 (2 x 40); 200 alone
    assert score_batches(shapes, max_tokens=100, vocabulary=1000) == [[1, 0], [4, 2], [3]]
    wide = score_batches([(10, 9)] * 8, max_tokens=10_000, vocabulary=2**21)
    assert [len(g) for g in wide] == [1] * 8  # two rows' 10 kept logits x 2^21 words > 2^25


def test_batch_limits_come_from_the_device_or_the_command_line():
    from transformers import LlamaConfig

    config = LlamaConfig(
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576
    )  # fmt: skip  (SmolLM2-135M's shape)
    per_token = kv_bytes_per_token(config, 2)
    assert per_token == 2 * 30 * 3 * 64 * 2  # keys and values, 30 layers, 3 heads of 64, bf16
    assert device_limits("cpu", per_token) == (CPU_MAX_SEQUENCES, CPU_MAX_TOKENS)
    sequences, tokens = device_limits("cuda", per_token, free_bytes=40 * 2**30)
    assert sequences >= 256 and tokens == 20 * 2**30 // per_token
    args = _parse(["--hf-max-batch-sequences", "256", "--hf-max-batch-tokens", "500000"])
    assert hf_options(args) == {
        "max_sequences": 256,
        "max_batch_tokens": 500_000,
        "cpu_dtype": "auto",
    }
    assert hf_options(_parse(["--hf-cpu-dtype", "float32"]))["cpu_dtype"] == "float32"
    with pytest.raises(SystemExit):
        _parse(["--hf-cpu-dtype", "float16"])
    with pytest.raises(SystemExit):
        _parse(["--hf-max-batch-tokens", "0"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("batching") / "tiny")


async def _loaded_dtype(model_dir, cpu_dtype: str) -> str:
    from nip_core.lm_server.engines.hf import TransformersEngine

    engine = TransformersEngine(str(model_dir), cpu_dtype=cpu_dtype)
    await engine.start()
    try:
        return str(engine.base.dtype)
    finally:
        await engine.stop()


def test_on_cpu_the_engine_computes_in_bf16_only_where_the_cpu_has_it(tiny, monkeypatch):
    from nip_core.lm_server import hardware
    from nip_core.lm_server.engines import hf

    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert hf.TransformersEngine(str(tiny)).cpu_dtype == "float32"
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert hf.TransformersEngine(str(tiny)).cpu_dtype == "bfloat16"
    assert hf.TransformersEngine(str(tiny), cpu_dtype="float32").cpu_dtype == "float32"
    with pytest.raises(ValueError, match="cpu_dtype"):
        hf.TransformersEngine(str(tiny), cpu_dtype="half")
    assert asyncio.run(_loaded_dtype(tiny, "bfloat16")) == "torch.bfloat16"
    assert asyncio.run(_loaded_dtype(tiny, "float32")) == "torch.float32"


def _request(model, content: str, seed: int | None, n: int = 1, **sampling) -> ChatRequest:
    messages = [{"role": "user", "content": content}]
    sampling = {"temperature": 1.0, "max_tokens": 8} | sampling
    return ChatRequest(model=str(model), messages=messages, n=n, seed=seed, **sampling)


async def _seeded_answers(model_dir, monkeypatch) -> None:
    from nip_core.lm_server.engines import hf_decode
    from nip_core.lm_server.engines.hf import TransformersEngine

    joins, steps, loop = [], [], asyncio.get_running_loop()
    stepping = asyncio.Event()
    merge, decode = hf_decode.merge, hf_decode.decode

    def recording_merge(first, second, pad_id):
        joins.append((first.size if first else 0, second.size))
        return merge(first, second, pad_id)

    def slow_decode(model, batch):  # a few ms a step, and a signal once the batch is under way
        steps.append(batch.size)
        if len(steps) == 3:
            loop.call_soon_threadsafe(stepping.set)
        time.sleep(0.005)
        return decode(model, batch)

    monkeypatch.setattr(hf_decode, "merge", recording_merge)
    monkeypatch.setattr(hf_decode, "decode", slow_decode)
    engine = TransformersEngine(str(model_dir))
    await engine.start()
    try:
        judged = _request(model_dir, "judge this code", 7, n=2)
        alone = await engine.chat(judged)
        others = [
            _request(
                model_dir,
                f"another prompt {i}",
                100 + i,
                n=1 + i % 3,
                temperature=[0.5, 1.3, 0.0, 1.0][i % 4],
                top_p=[1.0, 0.8][i % 2],
                max_tokens=4 + 3 * i,
            )  # fmt: skip
            for i in range(5)
        ]
        together = await asyncio.gather(*(engine.chat(r) for r in others), engine.chat(judged))
        assert together[-1] == alone  # the batch it shares does not change a seeded answer
        assert [len(answers) for answers in together[:-1]] == [1, 2, 3, 1, 2]
        assert together[2][0] == together[2][1] == together[2][2]  # greedy: n equal answers
        assert alone[0].text != alone[1].text  # the n samples are different draws
        assert await engine.chat(_request(model_dir, "judge this code", 8, n=2)) != alone

        async def later(request: ChatRequest):
            await stepping.wait()  # the first request has decoded 3 steps: this one joins it
            return await engine.chat(request)

        joins.clear()
        steps.clear()
        stepping.clear()
        long = _request(model_dir, "write a long answer", 5, max_tokens=60, temperature=0.9)
        _, joined = await asyncio.gather(engine.chat(long), later(judged))
        assert joined == alone
        assert any(running and fresh for running, fresh in joins), joins  # merged mid-batch
    finally:
        await engine.stop()


@pytest.mark.slow
def test_seeded_requests_answer_the_same_whatever_their_batch(tiny, monkeypatch):
    asyncio.run(_seeded_answers(tiny, monkeypatch))


async def _scores(model_dir) -> None:
    from nip_core.lm_server.engines.hf import TransformersEngine

    chat = [{"role": "user", "content": "Is this code correct?"}]
    replies = ["Decision: accept", "no", "", "Decision: reject because the loop stops early " * 3]
    conversations = [[*chat, {"role": "assistant", "content": r}] for r in replies]
    conversations.append(
        [{"role": "user", "content": "short"}, {"role": "assistant", "content": "ok"}]
    )
    engine = TransformersEngine(str(model_dir))
    await engine.start()
    try:
        batched = await engine.score(str(model_dir), conversations)
        one_by_one = [(await engine.score(str(model_dir), [c]))[0] for c in conversations]
    finally:
        await engine.stop()
    assert [tokens for _, tokens in batched] == [tokens for _, tokens in one_by_one]
    assert batched[2] == (0.0, 0)
    for (ours, _), (alone, _) in zip(batched, one_by_one, strict=True):
        assert ours == pytest.approx(alone, abs=1e-3)


@pytest.mark.slow
def test_batched_scoring_equals_scoring_each_conversation_alone(tiny):
    asyncio.run(_scores(tiny))


async def _failures(model_dir, monkeypatch) -> None:
    from nip_core.lm_server.engines import hf_decode
    from nip_core.lm_server.engines.hf import TransformersEngine

    start, calls = hf_decode.start, []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return start(*args, **kwargs)

    monkeypatch.setattr(hf_decode, "start", failing_once)
    engine = TransformersEngine(str(model_dir))
    await engine.start()
    try:
        with pytest.raises(RuntimeError, match="out of memory"):
            await engine.chat(_request(model_dir, "first", 1))
        (answer,) = await engine.chat(_request(model_dir, "second", 2))  # still serving
        assert answer.finish_reason in ("stop", "length")
        with pytest.raises(ValueError, match="not loaded"):
            await engine.chat(_request("no-such-model", "third", 3))
    finally:
        await engine.stop()


@pytest.mark.slow
def test_a_failed_step_answers_its_callers_with_the_error_and_serving_goes_on(tiny, monkeypatch):
    asyncio.run(_failures(tiny, monkeypatch))
