"""The call journal replays finished model calls and survives a torn last line."""

import asyncio
from dataclasses import dataclass

from nip_core.agents.call_journal import JournaledClient


@dataclass(frozen=True)
class Sampling:
    seed: int


class CountingClient:
    def __init__(self):
        self.calls = 0

    async def complete(self, messages, model, n, sampling):
        self.calls += 1
        return [f"{messages[-1]['content']}-{sampling.seed}-{i}" for i in range(n)]


def test_replays_journaled_calls_across_instances(tmp_path):
    journal = tmp_path / "calls.jsonl"
    first = CountingClient()
    client = JournaledClient(first, journal)
    msgs = [{"role": "user", "content": "hi"}]
    texts = asyncio.run(client.complete(msgs, "m", 2, Sampling(3)))
    assert texts == ["hi-3-0", "hi-3-1"] and first.calls == 1

    second = CountingClient()
    resumed = JournaledClient(second, journal)
    assert asyncio.run(resumed.complete(msgs, "m", 2, Sampling(3))) == texts
    assert second.calls == 0 and resumed.replayed == 1
    asyncio.run(resumed.complete(msgs, "m", 2, Sampling(4)))
    assert second.calls == 1


def test_torn_last_line_is_ignored(tmp_path):
    journal = tmp_path / "calls.jsonl"
    client = JournaledClient(CountingClient(), journal)
    asyncio.run(client.complete([{"role": "user", "content": "a"}], "m", 1, Sampling(1)))
    with open(journal, "a") as f:
        f.write('{"key": "abc", "texts": ["tru')
    inner = CountingClient()
    resumed = JournaledClient(inner, journal)
    assert len(resumed.entries) == 1
    asyncio.run(resumed.complete([{"role": "user", "content": "a"}], "m", 1, Sampling(1)))
    assert inner.calls == 0
