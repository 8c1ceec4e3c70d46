"""The call journal replays finished model calls and survives a torn last line."""

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path

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


def test_replies_holding_unicode_line_separators_are_replayed(tmp_path):
    """A journal line ends at "\\n" only: a reply with U+2028 in it is replayed, not redone."""
    journal = tmp_path / "calls.jsonl"
    client = JournaledClient(CountingClient(), journal)
    msgs = [{"role": "user", "content": "a\u2028b\x85c\u2029"}]
    texts = asyncio.run(client.complete(msgs, "m", 1, Sampling(1)))
    inner = CountingClient()
    resumed = JournaledClient(inner, journal)
    assert asyncio.run(resumed.complete(msgs, "m", 1, Sampling(1))) == texts
    assert inner.calls == 0 and resumed.replayed == 1


class SlowClient(CountingClient):
    """Finishes calls at staggered moments, as a server answering a tree level does."""

    async def complete(self, messages, model, n, sampling):
        await asyncio.sleep(0.001 * (sampling.seed % 7))
        return await super().complete(messages, model, n, sampling)


def test_concurrent_calls_share_group_commits_and_are_all_durable(tmp_path):
    journal = tmp_path / "calls.jsonl"
    client = JournaledClient(SlowClient(), journal)
    msgs = [{"role": "user", "content": "q"}]

    async def many():
        texts = await asyncio.gather(
            *(client.complete(msgs, "m", 1, Sampling(s)) for s in range(300))
        )
        await client.aclose()
        return texts

    texts = asyncio.run(many())
    assert texts == [[f"q-{s}-0"] for s in range(300)]
    assert 1 <= client.writes < 300  # calls finishing together share one write and fsync
    lines = journal.read_text().splitlines()
    assert len(lines) == 300
    resumed_inner = CountingClient()
    resumed = JournaledClient(resumed_inner, journal)

    async def replay():
        return await asyncio.gather(
            *(resumed.complete(msgs, "m", 1, Sampling(s)) for s in range(300))
        )

    again = asyncio.run(replay())
    assert again == texts and resumed_inner.calls == 0 and resumed.replayed == 300


def test_a_failed_write_fails_the_calls_waiting_on_it(tmp_path, monkeypatch):
    client = JournaledClient(CountingClient(), tmp_path / "calls.jsonl")

    def broken(text):
        raise OSError("disk full")

    monkeypatch.setattr(client, "_write", broken)
    msgs = [{"role": "user", "content": "q"}]
    try:
        asyncio.run(client.complete(msgs, "m", 1, Sampling(1)))
    except OSError as error:
        assert "disk full" in str(error)
    else:
        raise AssertionError("a call whose journal line was not written must not succeed")
    assert not client.entries  # not recorded as finished


def test_earlier_journals_are_replayed_but_never_written(tmp_path):
    earlier = tmp_path / "it0" / "guard-calls-0.jsonl"
    asked = [{"role": "user", "content": "kept model"}]
    asyncio.run(JournaledClient(CountingClient(), earlier).complete(asked, "m", 1, Sampling(5)))
    before = earlier.read_text()

    inner = CountingClient()
    own = tmp_path / "it1" / "guard-calls-0.jsonl"
    client = JournaledClient(inner, own, earlier=[earlier, tmp_path / "missing.jsonl"])
    assert asyncio.run(client.complete(asked, "m", 1, Sampling(5))) == ["kept model-5-0"]
    assert inner.calls == 0 and client.replayed == 1
    asyncio.run(client.complete(asked, "other-model", 1, Sampling(5)))
    assert inner.calls == 1
    # the new call is in this journal only; the earlier one is untouched
    assert len(own.read_text().splitlines()) == 1 and earlier.read_text() == before


def test_sibling_journals_name_every_part_of_an_endpoint_in_the_first_iteration(tmp_path):
    """A replayed run's stage journal and its shards' (appended files locally, `.d` folders of
    segments on an object store), for one endpoint only."""
    from nip_core.play.rollout_stage import sibling_journals
    from nip_core.run.artifacts import RunPaths

    other = RunPaths.open(str(tmp_path), "malt")
    first = Path(other.iteration_dir(0))
    first.mkdir(parents=True)
    for name in ("calls-0.jsonl", "calls-1.jsonl", "calls-shard-00000-0.jsonl"):
        (first / name).write_text("")
    (first / "calls-shard-00001-0.jsonl.d").mkdir()  # segments, as on an object store
    (first / "calls-shard-00001-10.jsonl").write_text("")  # endpoint 10, not 0
    Path(other.iteration_dir(1)).mkdir(parents=True)
    (Path(other.iteration_dir(1)) / "calls-shard-00000-0.jsonl").write_text("")
    paths = replace(RunPaths.open(str(tmp_path), "control"), replay_runs=(other.run_dir,))
    assert sibling_journals(paths, 0) == [
        f"{first}/calls-0.jsonl",
        f"{first}/calls-shard-00000-0.jsonl",
        f"{first}/calls-shard-00001-0.jsonl",
    ]
    assert sibling_journals(RunPaths.open(str(tmp_path), "alone"), 0) == []
