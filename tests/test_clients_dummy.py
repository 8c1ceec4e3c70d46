"""Tests for the offline DummyChatClient in nip_core.agents.clients: determinism and role shapes."""

from __future__ import annotations

import asyncio
import time

import pytest

from nip_core.agents.clients import DummyChatClient, SamplingParams, request_digest

VERIFIER_SYSTEM = (
    "Ask questions as 'Question for Expert: ...'. Then write exactly "
    "'Decision: accept' or 'Decision: reject'."
)
DEBATE_SYSTEM = (
    "Ask 'Question for Expert_1: ...' and 'Question for Expert_2: ...' each round. "
    "Finish with Decision: accept or Decision: reject."
)
PROVER_SYSTEM = "Convince Verifier to accept. Begin with 'Answer: '."


def convo(system: str, k: int, *extra: dict) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": f"item {k}"}, *extra]


def dummy_run(client: DummyChatClient, messages: list[dict], n: int, seed: int | None = None):
    return asyncio.run(client.complete(messages, "dummy", n, SamplingParams(seed=seed)))


def test_dummy_is_deterministic_across_instances() -> None:
    msgs = convo(VERIFIER_SYSTEM, 1)
    first = dummy_run(DummyChatClient(7), msgs, 8, seed=1)
    assert first == dummy_run(DummyChatClient(7), msgs, 8, seed=1)
    assert first != dummy_run(DummyChatClient(8), msgs, 8, seed=1)
    assert first != dummy_run(DummyChatClient(7), msgs, 8, seed=2)
    assert len(set(first)) > 3  # variety over the sample index
    assert dummy_run(DummyChatClient(7), msgs, 3, seed=1) == first[:3]


def test_dummy_roles() -> None:
    client = DummyChatClient(0, invalid_probability=0.0)
    prover = [t for k in range(20) for t in dummy_run(client, convo(PROVER_SYSTEM, k), 2)]
    assert all(t.startswith("Answer: ") for t in prover)
    verifier = [t for k in range(200) for t in dummy_run(client, convo(VERIFIER_SYSTEM, k), 1)]
    accepts = verifier.count("Decision: accept") / len(verifier)
    rejects = verifier.count("Decision: reject") / len(verifier)
    assert 0.1 < accepts < 0.3 and 0.1 < rejects < 0.3
    questions = [t for t in verifier if not t.startswith("Decision:")]
    assert questions and all(q.startswith("Question for Expert: ") for q in questions)
    debate = [t for k in range(50) for t in dummy_run(client, convo(DEBATE_SYSTEM, k), 1)]
    for text in (t for t in debate if not t.startswith("Decision:")):
        lines = text.splitlines()
        assert [line.split(":")[0] for line in lines] == [
            "Question for Expert_1",
            "Question for Expert_2",
        ]


@pytest.mark.parametrize(
    ("role", "note"),
    [
        ("system", "You cannot ask any more questions. You must now make a decision."),
        ("system", "You have no questions left. Reply now with your decision on the solution."),
        ("user", "You cannot ask any more questions, so you must now decide."),
    ],
)
def test_dummy_decides_when_told_to(role: str, note: str) -> None:
    client = DummyChatClient(3, invalid_probability=0.5)
    forced = {"role": role, "content": note, **({"name": "Supervisor"} if role == "user" else {})}
    texts = [t for k in range(50) for t in dummy_run(client, convo(VERIFIER_SYSTEM, k, forced), 2)]
    assert set(texts) == {"Decision: accept", "Decision: reject"}
    not_forced = {"role": "user", "content": note, "name": "Expert"}  # quoted by a prover
    texts = [
        t for k in range(50) for t in dummy_run(client, convo(VERIFIER_SYSTEM, k, not_forced), 1)
    ]
    assert any(t.startswith("Question") for t in texts)


def test_dummy_invalid_rate() -> None:
    client = DummyChatClient(1, invalid_probability=0.3)
    texts = [t for k in range(400) for t in dummy_run(client, convo(VERIFIER_SYSTEM, k), 1)]
    rate = texts.count("Decision: maybe") / len(texts)
    assert 0.22 < rate < 0.38
    debate = [t for k in range(400) for t in dummy_run(client, convo(DEBATE_SYSTEM, k), 1)]
    missing = [t for t in debate if t.startswith("Question") and "Expert_2" not in t]
    assert 0.22 < len(missing) / len(debate) < 0.38
    none = DummyChatClient(1, invalid_probability=0.0)
    assert "Decision: maybe" not in [
        dummy_run(none, convo(VERIFIER_SYSTEM, k), 1)[0] for k in range(200)
    ]


def test_dummy_latency_runs_concurrently_and_logs_calls() -> None:
    client = DummyChatClient(0, latency=0.2)

    async def ten() -> list[list[str]]:
        calls = [
            client.complete(convo(PROVER_SYSTEM, k), "m", 1, SamplingParams()) for k in range(10)
        ]
        return await asyncio.gather(*calls)

    start = time.perf_counter()
    asyncio.run(ten())
    assert time.perf_counter() - start < 1.0
    assert client.calls == 10 and len(set(client.call_keys)) == 10
    expected = request_digest(convo(PROVER_SYSTEM, 0), "m", 1, SamplingParams())
    assert expected in client.call_keys
