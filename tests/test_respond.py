"""Sampling agent responses: one call for n samples, re-sampling only the invalid ones.

Run: pytest tests/test_respond.py -q
"""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from nip_core.agents import (
    AgentResponse,
    DummyChatClient,
    SamplingParams,
    attempt_seed,
    chat_messages,
    generate_responses,
)
from nip_core.episode import ACCEPT, REJECT
from tests.agent_fixtures import build_protocol, make_datapoint, make_params

NIP = build_protocol("nip", rounds=5)
DEBATE = build_protocol("debate")
CHAT = [{"role": "system", "content": "You are Verifier."}]


class ScriptedClient:
    """Returns pre-written batches in order and records each call's n and sampling params."""

    def __init__(self, *batches: list[str]) -> None:
        self.batches = deque(batches)
        self.calls: list[tuple[int, SamplingParams]] = []

    async def complete(self, messages, model, n, sampling):
        self.calls.append((n, sampling))
        batch = self.batches.popleft()
        assert len(batch) == n, f"script expected n={len(batch)}, got n={n}"
        return batch


def run(
    client,
    protocol=NIP,
    agent="verifier",
    n=1,
    round=0,
    retries=20,
    seed=11,
    early_verdict_retries=0,
    **params,
):
    agent_params = make_params(num_invalid_generation_retries=retries, **params)
    return asyncio.run(
        generate_responses(
            client,
            protocol,
            agent,
            agent_params,
            "model-x",
            CHAT,
            n,
            round,
            0,
            seed,
            early_verdict_retries=early_verdict_retries,
        )
    )


def test_valid_samples_need_one_call() -> None:
    client = ScriptedClient(["Decision: accept", "Question for Expert: why?", "I reject it."])
    out = run(client, n=3)
    assert [r.decision for r in out] == [ACCEPT, None, REJECT]
    assert out[1].messages == {"main": "Question for Expert: why?"}
    assert out[0].messages == {} and all(r.retries == 0 and r.failure is None for r in out)
    assert [n for n, _ in client.calls] == [3]


def test_sampling_params_come_from_agent_params() -> None:
    client = ScriptedClient(["Decision: accept"])
    run(client, temperature=0.7, repetition_penalty=1.1, max_response_words=100)
    _, sampling = client.calls[0]
    assert sampling == SamplingParams(
        temperature=0.7, top_p=None, max_tokens=150, seed=11, repetition_penalty=1.1
    )
    client = ScriptedClient(["Decision: accept"])
    run(client, top_p=0.9, max_tokens_per_message=40)
    assert client.calls[0][1].max_tokens == 40 and client.calls[0][1].top_p == 0.9


def test_only_invalid_samples_are_resampled_in_order() -> None:
    client = ScriptedClient(
        ["Decision: maybe", "Decision: reject", "Decision: what?"],
        ["Decision: accept", "Decision: unsure"],
        ["Question for Expert: fine, how about n = 0?"],
    )
    out = run(client, n=3)
    assert [n for n, _ in client.calls] == [3, 2, 1]
    assert [r.raw for r in out] == [
        "Decision: accept",
        "Decision: reject",
        "Question for Expert: fine, how about n = 0?",
    ]
    assert [r.retries for r in out] == [1, 0, 2]
    assert [r.decision for r in out] == [ACCEPT, REJECT, None]
    seeds = [sampling.seed for _, sampling in client.calls]
    assert seeds == [11, attempt_seed(11, 1), attempt_seed(11, 2)]
    assert len(set(seeds)) == 3


def test_retry_exhaustion_gives_failure_without_messages() -> None:
    client = ScriptedClient(*[["Decision: perhaps"]] * 3, ["Decision: dunno"])
    out = run(client, retries=3)
    assert len(client.calls) == 4
    (response,) = out
    assert response.messages == {} and response.decision is None and response.retries == 3
    assert response.raw == "Decision: dunno"
    assert "after 3 retries" in response.failure and "Decision: dunno" in response.failure


ASK_FIRST = build_protocol("nip", rounds=5, early_decision_ends_episode=True)
ASK_FIRST = type(ASK_FIRST)(**{**ASK_FIRST.__dict__, "min_message_rounds": 3})


def test_early_verdicts_are_resampled_until_a_question() -> None:
    """Only the early verdicts are asked again, each kept until a valid non-verdict comes; an
    invalid or still-early fresh sample leaves the verdict, which stands once the tries end."""
    client = ScriptedClient(
        ["Decision: reject", "Question for Expert: why?", "Decision: accept"],
        ["Decision: accept", "   "],
        ["Question for Expert: and n = 0?", "Decision: reject"],
    )
    out = run(client, protocol=ASK_FIRST, n=3, early_verdict_retries=2)
    assert [n for n, _ in client.calls] == [3, 2, 2]
    assert out[0].messages == {"main": "Question for Expert: and n = 0?"}
    assert out[0].decision is None and out[0].retries == 2
    assert out[1].retries == 0
    assert out[2].decision == ACCEPT and out[2].failure is None and out[2].retries == 2
    assert out[2].raw == "Decision: accept"
    seeds = [sampling.seed for _, sampling in client.calls]
    assert len(set(seeds)) == 3 and attempt_seed(11, 1) not in seeds


def test_verdicts_are_not_resampled_where_they_count_or_without_retries() -> None:
    counted = run(
        ScriptedClient(["Decision: reject"]), protocol=ASK_FIRST, round=2, early_verdict_retries=3
    )
    assert counted[0].decision == REJECT and counted[0].retries == 0
    kept = run(ScriptedClient(["Decision: reject"]), protocol=ASK_FIRST)
    assert kept[0].decision == REJECT and kept[0].retries == 0


def test_zero_retries_fails_immediately() -> None:
    client = ScriptedClient(["   "])
    (response,) = run(client, retries=0)
    assert response.failure is not None and "empty" in response.failure
    assert len(client.calls) == 1


def test_debate_failure_leaves_every_channel_empty() -> None:
    client = ScriptedClient(["Question for Expert_1: only one"], ["Question for Expert_1: again"])
    (response,) = run(client, protocol=DEBATE, retries=1)
    assert response.messages == {} and "Question for Expert_2:" in response.failure


def test_wrong_sample_count_is_an_error() -> None:
    class Short:
        async def complete(self, messages, model, n, sampling):
            return ["Decision: accept"]

    with pytest.raises(RuntimeError, match="returned 1 completions, expected 2"):
        run(Short(), n=2)
    with pytest.raises(ValueError, match="n must be at least 1"):
        run(ScriptedClient(), n=0)


def test_with_dummy_client_is_deterministic() -> None:
    params = make_params()
    chat = chat_messages(NIP, "verifier", params, make_datapoint(), [], 0, 0)

    async def sample() -> list[AgentResponse]:
        client = DummyChatClient(seed=5, invalid_probability=0.5)
        return await generate_responses(client, NIP, "verifier", params, "m", chat, 6, 0, 0, 3)

    first, second = asyncio.run(sample()), asyncio.run(sample())
    assert first == second
    assert all(r.failure is None for r in first)
    assert any(r.retries > 0 for r in first)  # the dummy wrote some "Decision: maybe"
    assert all((r.decision is None) == bool(r.messages) for r in first)
