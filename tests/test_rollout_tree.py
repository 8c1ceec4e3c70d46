"""Tree growth: node ids, branching, frozen agents, determinism, call shape, no level barrier."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import fields, replace

import pytest

from nip_core.agents import DummyChatClient
from nip_core.episode import Datapoint
from nip_core.malt.rollout_tree import (
    BatchItem,
    RolloutSettings,
    batch_items,
    batch_table,
    children_per_node,
    grow_trees,
    history,
    turns_by_node,
)
from nip_core.malt.tree_values import pairs_table, rewards_table
from nip_core.parameters import HyperParameters, apply_overrides
from nip_core.play.episodes import rollout_settings
from nip_core.protocols import active_agents
from nip_core.run.iteration_context import build_context
from nip_core.seeding import call_seed


def make_context(protocol: str = "nip", *overrides: str, iteration: int = 0):
    hp = apply_overrides(
        HyperParameters.construct_test_params(),
        [f"interaction_protocol={protocol}", *overrides],
    )
    return build_context(hp, "tree-test", iteration)


def make_items(count: int = 4) -> list[BatchItem]:
    return [
        BatchItem(
            batch_index=i,
            datapoint=Datapoint(
                id=100 + i,
                question=f"Return the sum of the first {i} numbers.",
                solution=f"def f():\n    return {i * (i + 1) // 2}",
                y=i % 2,
                prover_stance=1,
            ),
            episode_seed=1000 + 17 * i,
        )
        for i in range(count)
    ]


class RecordingClient:
    """Wraps a client and records (sampling seed, n) of every call."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[tuple[int, int]] = []

    async def complete(self, messages, model, n, sampling):
        self.calls.append((sampling.seed, n))
        return await self.inner.complete(messages, model, n, sampling)


class ScriptedClient:
    """Always answers `text`, except that `valid_after` repeats of a chat get `valid_text`."""

    def __init__(self, text: str, valid_text: str | None = None, valid_after: int = 0) -> None:
        self.text, self.valid_text, self.valid_after = text, valid_text, valid_after
        self.seen: Counter = Counter()
        self.calls = 0

    async def complete(self, messages, model, n, sampling):
        self.calls += 1
        key = repr(messages)
        self.seen[key] += 1
        if self.valid_text is not None and self.seen[key] > self.valid_after:
            return [self.valid_text] * n
        return [self.text] * n


def grow(context, client, items=None, **changes):
    settings = rollout_settings(context, {a: client for a in context.agent_names})
    if changes:
        settings = RolloutSettings(**{**settings.__dict__, **changes})
    return asyncio.run(grow_trees(items if items is not None else make_items(), settings))


def children_of(table) -> dict[str, list[str]]:
    children: dict[str, list[str]] = defaultdict(list)
    for row in table.to_pylist():
        if row["parent_id"] is not None:
            children[row["parent_id"]].append(row["node_id"])
    return children


def test_node_ids_come_from_tree_position():
    ctx = make_context("nip", "nip_protocol.max_message_rounds=4")
    table = grow(ctx, DummyChatClient(3, invalid_probability=0.0))
    rows = table.to_pylist()
    roots = [r for r in rows if r["parent_id"] is None]
    assert [r["node_id"] for r in roots] == ["b0", "b1", "b2", "b3"]
    assert all(r["round"] == -1 and r["acted"] == [] for r in roots)
    for parent, kids in children_of(table).items():
        assert kids == [f"{parent}.{k}" for k in range(len(kids))]
    for row in rows:
        assert row["round"] == row["node_id"].count(".") - 1
        assert row["batch_index"] == int(row["node_id"].split(".")[0][1:])
    assert len({r["node_id"] for r in rows}) == len(rows)


def test_open_nodes_get_k_children_and_ended_nodes_none():
    ctx = make_context(
        "nip", "nip_protocol.max_message_rounds=5", "pure_text_malt.num_responses_per_timestep=3"
    )
    table = grow(ctx, DummyChatClient(5, invalid_probability=0.0))
    children = children_of(table)
    rows = table.to_pylist()
    early_ends = [r for r in rows if r["ended"] and r["round"] < 4]
    assert early_ends, "the fixture should include an episode that ends before the last round"
    for row in rows:
        count = len(children.get(row["node_id"], []))
        assert count == (0 if row["ended"] else 3), row["node_id"]
    last_round = [r for r in rows if r["round"] == 4]  # the verifier's last turn
    assert last_round and all(r["ended"] for r in last_round)
    # an undecided last round is a termination, a decided one is not
    assert all(r["terminated"] == (r["decision"] is None) for r in last_round)


def test_children_per_node_rule():
    ctx = make_context("debate", "agents.verifier.freeze_agent=true")
    settings = rollout_settings(ctx, {})
    assert children_per_node(settings, ("verifier",)) == 1
    assert children_per_node(settings, ("prover0", "prover1")) == 2
    no_shortcut = RolloutSettings(
        **{**settings.__dict__, "frozen_agents_generate_one_response": False}
    )
    assert children_per_node(no_shortcut, ("verifier",)) == 2


def _children_by_round(table) -> dict[int, set[int]]:
    children = children_of(table)
    by_round: dict[int, set[int]] = defaultdict(set)
    for row in table.to_pylist():
        if not row["ended"]:
            by_round[row["round"] + 1].add(len(children[row["node_id"]]))
    return by_round


def test_all_frozen_round_gets_one_child_mixed_round_gets_k():
    """Simultaneous debate: the verifier speaks in even rounds, both provers in odd rounds."""
    ctx = make_context(
        "debate",
        "debate_protocol.max_message_rounds=5",
        "debate_protocol.sequential=false",
        "agents.verifier.freeze_agent=true",
        "agents.prover0.freeze_agent=true",
        "pure_text_malt.num_responses_per_timestep=3",
    )
    assert ctx.frozen_agents == {"verifier", "prover0"}
    table = grow(ctx, DummyChatClient(1, invalid_probability=0.0))
    by_round = _children_by_round(table)
    assert by_round[0] == by_round[2] == by_round[4] == {1}  # only the frozen verifier acts
    assert by_round[1] == by_round[3] == {3}  # frozen prover0 with trainable prover1


def test_frozen_provers_branch_once_and_trainable_verifier_k_times():
    ctx = make_context(
        "debate",
        "debate_protocol.max_message_rounds=4",
        "agents.prover0.freeze_agent=true",
        "agents.prover1.freeze_agent=true",
    )
    by_round = _children_by_round(grow(ctx, DummyChatClient(1, invalid_probability=0.0)))
    assert by_round[0] == {2} and by_round[1] == {1}


def test_frozen_agents_branch_k_times_without_the_shortcut():
    ctx = make_context(
        "debate",
        "debate_protocol.max_message_rounds=3",
        "agents.verifier.freeze_agent=true",
        "agents.prover0.freeze_agent=true",
        "agents.prover1.freeze_agent=true",
        "pure_text_malt.frozen_agents_generate_one_response=false",
    )
    by_round = _children_by_round(grow(ctx, DummyChatClient(1, invalid_probability=0.0)))
    assert set().union(*by_round.values()) == {2}


@pytest.mark.parametrize("protocol", ["nip", "debate", "merlin_arthur"])
def test_only_active_agents_act(protocol):
    ctx = make_context(
        protocol, f"{'debate' if protocol == 'debate' else 'nip'}_protocol.max_message_rounds=4"
    )
    items = make_items()
    seeds = {it.batch_index: it.episode_seed for it in items}
    table = grow(ctx, DummyChatClient(2, invalid_probability=0.0), items)
    for row in table.to_pylist():
        if row["round"] < 0:
            continue
        active = set(active_agents(ctx.protocol, row["round"], seeds[row["batch_index"]]))
        assert active
        assert set(row["acted"]) <= active
        assert {m["agent"] for m in row["raw_messages"]} == active
        assert {m["agent"] for m in row["messages"]} <= active


def test_same_seed_same_table_and_other_run_seed_differs():
    ctx = make_context("nip", "nip_protocol.max_message_rounds=4")
    first = grow(ctx, DummyChatClient(0))
    again = grow(ctx, DummyChatClient(0))
    assert first.equals(again)
    other = grow(ctx, DummyChatClient(0), run_seed=ctx.hyper_params.seed + 1)
    assert not first.equals(other)
    assert first.column("node_id").to_pylist()[:4] == other.column("node_id").to_pylist()[:4]


class SlowForOneDatapoint:
    """Answers the calls about one problem after `delay` seconds and the others at once,
    recording when each call left and when it was answered."""

    def __init__(self, inner, slow_question: str, delay: float) -> None:
        self.inner, self.slow_question, self.delay = inner, slow_question, delay
        self.timeline: list[tuple[bool, float, float]] = []  # (slow?, sent, answered)

    async def complete(self, messages, model, n, sampling):
        loop = asyncio.get_running_loop()
        slow, sent = self.slow_question in repr(messages), loop.time()
        if slow:
            await asyncio.sleep(self.delay)
        replies = await self.inner.complete(messages, model, n, sampling)
        self.timeline.append((slow, sent, loop.time()))
        return replies


def test_a_slow_call_holds_up_only_its_own_subtree():
    """The other problems' later rounds leave while the slow problem's first call is out, and
    the table is the one a client without delays gives (BFS order, same rows)."""
    ctx = make_context("nip", "nip_protocol.max_message_rounds=3")
    items = make_items(3)
    client = SlowForOneDatapoint(DummyChatClient(5, invalid_probability=0.0), "first 0 ", 0.5)
    table = grow(ctx, client, items)
    first_slow_answer = min(answered for slow, _, answered in client.timeline if slow)
    later_fast_calls = [sent for slow, sent, _ in client.timeline if not slow]
    rounds_started = {row["round"] for row in table.to_pylist() if row["batch_index"] != 0}
    assert max(rounds_started) == 2  # the fast problems reached their last round...
    assert max(later_fast_calls) < first_slow_answer  # ...before the slow one's first answer
    assert table.equals(grow(ctx, DummyChatClient(5, invalid_probability=0.0), items))


def test_one_call_per_node_and_agent_with_n_children():
    ctx = make_context(
        "debate",
        "debate_protocol.max_message_rounds=4",
        "agents.verifier.freeze_agent=true",
        "pure_text_malt.num_responses_per_timestep=3",
    )
    items = make_items()
    client = RecordingClient(DummyChatClient(4, invalid_probability=0.0))
    table = grow(ctx, client, items)
    seeds = {it.batch_index: it.episode_seed for it in items}
    children = children_of(table)
    expected = Counter()
    for row in table.to_pylist():
        if row["ended"]:
            continue
        for agent in active_agents(ctx.protocol, row["round"] + 1, seeds[row["batch_index"]]):
            seed = call_seed(ctx.hyper_params.seed, 0, row["node_id"], agent)
            expected[(seed, len(children[row["node_id"]]))] += 1
    assert Counter(client.calls) == expected
    assert {n for _, n in client.calls} == {1, 3}


def test_always_invalid_verifier_is_recorded_as_failure():
    ctx = make_context(
        "nip",
        "nip_protocol.max_message_rounds=3",
        "agents.verifier.num_invalid_generation_retries=2",
    )
    client = ScriptedClient("Decision: maybe")  # a prover may say this; a verifier may not
    table = grow(ctx, client, make_items(1))
    verifier_rows = [r for r in table.to_pylist() if r["round"] in (0, 2)]
    assert verifier_rows
    for row in verifier_rows:
        assert row["failure"].startswith("verifier: invalid response after 2 retries")
        assert row["retries"] == 2
        assert "verifier" not in row["acted"] and row["decision"] is None
    leaves = [r for r in table.to_pylist() if r["round"] == 2]
    assert all(r["terminated"] for r in leaves)
    # per (node, verifier): one call plus two re-samples; provers: one call
    assert client.calls == 3 * 1 + 1 * 2 + 3 * 4


@pytest.mark.parametrize("ends", [False, True])
def test_an_early_verdict_ends_the_tree_branch_where_the_protocol_says_so(ends):
    """Every agent answers "Decision: reject" (a prover's is a message): read as a message, the
    round-0 verdict lets the chat go on to the verdict at round 2; ending the episode, the
    branch stops at round 0, undecided, with the terminated penalty."""
    ctx = make_context(
        "nip",
        "nip_protocol.max_message_rounds=3",
        "nip_protocol.min_message_rounds=3",
        f"protocol_common.early_decision_ends_episode={ends}",
    )
    table = grow(ctx, ScriptedClient("Decision: reject"), make_items(1))
    rows = [r for r in table.to_pylist() if r["round"] >= 0]  # below the root
    verifier_reward = {
        r["node_id"]: dict((s["agent"], s["reward"]) for s in r["step_rewards"])["verifier"]
        for r in rows
    }
    first = [r for r in rows if r["round"] == 0]
    assert first and all(r["decision"] is None for r in first)
    if ends:
        assert all(r["terminated"] for r in first) and max(r["round"] for r in rows) == 0
        assert all(r["acted"] == ["verifier"] for r in first), "an early verdict is a move"
        assert {verifier_reward[r["node_id"]] for r in first} == {-1.0}
    else:
        assert not any(r["terminated"] for r in first)
        last = [r for r in rows if r["round"] == 2]
        assert last and all(r["decision"] == 0 for r in last)


def test_a_question_pairs_with_an_early_verdict_beside_it():
    """Two replies a turn, one a verdict and one a question: at round 0 the verdict ends the
    episode penalised and the question goes on to a round-2 verdict, so MALT's interval
    selection prefers the question at round 0 (both siblings are the verifier's moves)."""
    ctx = make_context(
        "nip",
        "nip_protocol.max_message_rounds=3",
        "nip_protocol.min_message_rounds=3",
        "protocol_common.early_decision_ends_episode=true",
        "pure_text_malt.num_responses_per_timestep=2",
    )

    class VerdictOrQuestion:
        async def complete(self, messages, model, n, sampling):
            return ["Decision: reject", "Which input breaks it?"][:n]

    items = [item for item in make_items(4) if item.datapoint.y == 0]  # reject is right
    table = grow(ctx, VerdictOrQuestion(), items)
    rewards = rewards_table(table, ctx.agent_names, ctx.reward_midpoints, "monte_carlo")
    pairs = pairs_table(
        table,
        rewards,
        ctx.agent_names,
        method="interval",
        reward_midpoints=ctx.reward_midpoints,
        reward_ranges=ctx.reward_ranges,
        interval_threshold_proportion=0.25,
        seed=3,
    ).to_pylist()
    text = {
        r["node_id"]: r["raw_messages"][0]["content"]
        for r in table.to_pylist()
        if r["raw_messages"]
    }
    first = [p for p in pairs if p["agent"] == "verifier" and p["round"] == 0]
    assert len(first) == len(items)
    for pair in first:
        assert text[pair["chosen_node_id"]] == "Which input breaks it?"
        assert text[pair["rejected_node_id"]] == "Decision: reject"


def test_invalid_response_is_resampled():
    ctx = make_context("nip", "nip_protocol.max_message_rounds=1")
    client = ScriptedClient("Decision: maybe", valid_text="Decision: accept", valid_after=1)
    table = grow(ctx, client, make_items(1))
    leaves = [r for r in table.to_pylist() if r["round"] == 0]
    assert len(leaves) == 2
    for row in leaves:
        assert row["failure"] is None and row["retries"] == 1
        assert row["decision"] == 1 and row["acted"] == ["verifier"]
    assert client.calls == 2


def test_batch_table_round_trip_and_history():
    items = make_items(3)
    assert batch_items(batch_table(items)) == items
    # every Datapoint field survives, a pair's second solution included (it was once dropped)
    pair = replace(items[0], datapoint=replace(items[0].datapoint, other_solution="pass"))
    assert all(getattr(pair.datapoint, f.name) is not None for f in fields(Datapoint))
    assert batch_items(batch_table([pair])) == [pair]
    ctx = make_context("nip", "nip_protocol.max_message_rounds=3")
    table = grow(ctx, DummyChatClient(0, invalid_probability=0.0), items)
    index = turns_by_node(table)
    deepest = max(table.column("node_id").to_pylist(), key=lambda n: n.count("."))
    turns = history(index, deepest)
    assert [t.round for t in turns] == list(range(deepest.count(".")))


def test_a_rollout_temperature_heats_training_rollouts_only():
    from nip_core.play.episodes import evaluation_settings

    own = make_context("nip")
    assert rollout_settings(own, {}).agent_params == own.agent_params  # unset: the agents' own
    hot = make_context("nip", "pure_text_malt.rollout_temperature=1.7")
    rollouts = rollout_settings(hot, {}).agent_params
    assert {p.temperature for p in rollouts.values()} == {1.7}
    assert all(p.top_p is None for p in rollouts.values())
    evaluation = evaluation_settings(hot, {}, "test").agent_params
    assert evaluation == hot.agent_params  # evaluations and the guard sample as the agents do
    assert {p.temperature for p in evaluation.values()} != {1.7}
    with pytest.raises(ValueError, match="rollout_temperature"):
        make_context("nip", "pure_text_malt.rollout_temperature=2.5")


def test_early_verdicts_are_resampled_in_training_rollouts_only():
    """With `rollout_early_verdict_retries` a verifier that first judges at once, then asks when
    asked again, reaches the round where its verdict counts in training rollouts; evaluations
    keep the verdict as drawn. Without the rule the setting is refused."""
    from nip_core.play.episodes import evaluation_settings

    rules = (
        "nip",
        "nip_protocol.max_message_rounds=3",
        "nip_protocol.min_message_rounds=3",
        "protocol_common.early_decision_ends_episode=true",
    )
    ctx = make_context(*rules, "pure_text_malt.rollout_early_verdict_retries=2")
    assert rollout_settings(ctx, {}).early_verdict_retries == 2
    assert evaluation_settings(ctx, {}, "test").early_verdict_retries == 0
    client = ScriptedClient("Decision: reject", valid_text="Which input breaks it?", valid_after=1)
    rows = grow(ctx, client, make_items(1)).to_pylist()
    first = [r for r in rows if r["round"] == 0]
    assert first and all(not r["terminated"] and r["retries"] == 1 for r in first)
    assert max(r["round"] for r in rows) == 2
    as_drawn = grow(
        make_context(*rules),
        ScriptedClient("Decision: reject", valid_text="Which input breaks it?", valid_after=1),
        make_items(1),
    ).to_pylist()
    assert max(r["round"] for r in as_drawn) == 0
    with pytest.raises(ValueError, match="early_decision_ends_episode"):
        make_context("nip", "pure_text_malt.rollout_early_verdict_retries=2")
    with pytest.raises(ValueError, match="rollout_early_verdict_retries"):
        make_context(*rules, "pure_text_malt.rollout_early_verdict_retries=-1")
