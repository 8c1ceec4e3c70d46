"""DPO and SFT rows from grown trees: prompts, sibling texts, speaker names, EI selection."""

from __future__ import annotations

import asyncio
import collections
import warnings
from dataclasses import replace

import numpy as np
import pytest

from nip_core.agents import DummyChatClient, training_conversation
from nip_core.agents.parsing import parse_decision
from nip_core.episode import Datapoint
from nip_core.malt import dataset_export as export
from nip_core.malt import schemas, verifier_rows
from nip_core.malt.rollout_tree import BatchItem, grow_trees, history, turns_by_node
from nip_core.malt.tree_values import pairs_table, rewards_table
from nip_core.model_api.chat_format import fold_speaker_names, openai_messages
from nip_core.parameters import HyperParameters, apply_overrides
from nip_core.parameters.trainers import PureTextEiParameters, TextRlParameters
from nip_core.play.episodes import rollout_settings
from nip_core.run.iteration_context import build_context


def make_context(protocol: str, *overrides: str, iteration: int = 0):
    hp = apply_overrides(
        HyperParameters.construct_test_params(), [f"interaction_protocol={protocol}", *overrides]
    )
    return build_context(hp, "export-test", iteration)


def make_items(count: int) -> list[BatchItem]:
    return [
        BatchItem(
            i,
            Datapoint(300 + i, f"Add {i} to x.", f"def f(x):\n    return x + {i}", i % 2, 1),
            5000 + 31 * i,
        )
        for i in range(count)
    ]


def grow(ctx, items):
    client = DummyChatClient(11, invalid_probability=0.0)
    settings = rollout_settings(ctx, {a: client for a in ctx.agent_names})
    return asyncio.run(grow_trees(items, settings))


class Tree:
    """A grown tree with its rewards (and pairs for MALT) and the export context."""

    def __init__(self, ctx, count: int) -> None:
        self.ctx = ctx
        self.items = make_items(count)
        self.nodes = grow(ctx, self.items)
        self.rewards = rewards_table(
            self.nodes, ctx.agent_names, ctx.reward_midpoints, "monte_carlo"
        )
        self.export = export.ExportContext(
            ctx.protocol, ctx.agent_params, {it.batch_index: it for it in self.items}, ctx.iteration
        )

    def pairs(self):
        return pairs_table(
            self.nodes,
            self.rewards,
            self.ctx.agent_names,
            method="positive_negative",
            reward_midpoints=self.ctx.reward_midpoints,
            reward_ranges=self.ctx.reward_ranges,
            interval_threshold_proportion=0.1,
            seed=3,
        )

    def raw(self, node_id: str, agent: str) -> str:
        if not hasattr(self, "_raw"):
            self._raw = {
                r["node_id"]: {m["agent"]: m["content"] for m in r["raw_messages"]}
                for r in self.nodes.to_pylist()
            }
        return self._raw[node_id][agent]


@pytest.fixture(scope="module")
def debate_tree() -> Tree:
    ctx = make_context("debate", "debate_protocol.max_message_rounds=5")
    assert not ctx.is_ei_iteration
    return Tree(ctx, 4)


@pytest.fixture(scope="module")
def ei_tree() -> Tree:
    ctx = make_context(
        "nip", "trainer=pure_text_ei", "nip_protocol.max_message_rounds=5", iteration=3
    )
    assert ctx.is_ei_iteration and ctx.num_responses_per_timestep == 1
    return Tree(ctx, 24)


def test_dpo_prompt_is_the_agents_chat_at_the_parent(debate_tree):
    pairs = debate_tree.pairs()
    rows = export.dpo_rows(debate_tree.nodes, pairs, debate_tree.export)
    assert len(rows) == pairs.num_rows > 0
    assert {r["agent"] for r in rows} == {"verifier", "prover0", "prover1"}
    index = turns_by_node(debate_tree.nodes)
    for row in rows:
        agent, chosen = row["agent"], row["chosen_node_id"]
        item = debate_tree.export.items[row["datapoint_id"] - 300]
        # the conversation up to the chosen child, from the agent's side, minus its last reply
        full = training_conversation(
            debate_tree.ctx.protocol,
            agent,
            debate_tree.ctx.agent_params[agent],
            item.datapoint,
            history(index, chosen),
            item.episode_seed,
        )
        assert full[-1] == {"role": "assistant", "content": debate_tree.raw(chosen, agent)}
        assert row["openai_prompt"] == openai_messages(full[:-1])
        assert row["prompt"][0]["role"] == "system"
        assert row["prompt"][-1]["role"] != "assistant"
        assert chosen.rsplit(".", 1)[0] == row["parent_node_id"]
        assert row["chosen"] == [{"role": "assistant", "content": debate_tree.raw(chosen, agent)}]
        rejected = debate_tree.raw(row["rejected_node_id"], agent)
        assert row["rejected"] == [{"role": "assistant", "content": rejected}]
        assert row["chosen_expected_reward"] > row["rejected_expected_reward"]


def test_speaker_names_folded_for_trl_and_kept_for_openai(debate_tree):
    rows = export.dpo_rows(debate_tree.nodes, debate_tree.pairs(), debate_tree.export)
    named = [r for r in rows if any("name" in m for m in r["openai_prompt"])]
    quoted = {m.get("name") for r in named if r["agent"] == "verifier" for m in r["openai_prompt"]}
    assert {"Expert_1", "Expert_2"} <= quoted, "verifier prompts should quote both experts"
    for row in named:
        assert len(row["prompt"]) == len(row["openai_prompt"])
        for folded, original in zip(row["prompt"], row["openai_prompt"], strict=True):
            assert set(folded) == {"role", "content"}
            if "name" in original:
                assert original["name"] in ("Expert_1", "Expert_2", "Verifier")
                assert folded["content"] == f"{original['name']}: {original['content']}"
            else:
                assert folded["content"] == original["content"]
    table = export.dpo_table(rows)
    assert table.schema == schemas.DPO and table.num_rows == len(rows)
    jsonl = export.dpo_openai_jsonl(rows)
    assert jsonl[0] == {
        "input": {"messages": rows[0]["openai_prompt"]},
        "preferred_output": rows[0]["chosen"],
        "non_preferred_output": rows[0]["rejected"],
    }


def test_chat_format_helpers():
    chat = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "hi", "name": "Expert_1"},
        {"role": "user", "content": None, "name": ""},
    ]
    assert fold_speaker_names(chat) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "Expert_1: hi"},
        {"role": "user", "content": ""},
    ]
    assert openai_messages(chat) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "hi", "name": "Expert_1"},
        {"role": "user", "content": ""},
    ]


def _episode_reward(tree: Tree, leaf: str, agent: str) -> float:
    parent = {r["node_id"]: r["parent_id"] for r in tree.nodes.to_pylist()}
    step = {
        r["node_id"]: {s["agent"]: s["reward"] for s in r["step_rewards"]}
        for r in tree.nodes.to_pylist()
    }
    total, current = 0.0, leaf
    while current is not None:
        total += step[current].get(agent, 0.0)
        current = parent[current]
    return total


def _spoke(tree: Tree, leaf: str, agent: str) -> bool:
    turns = history(turns_by_node(tree.nodes), leaf)
    return any(agent in turn.raw for turn in turns)


def _leaves(tree: Tree) -> list[str]:
    parents = set(tree.nodes.column("parent_id").drop_null().to_pylist())
    return [n for n in tree.nodes.column("node_id").to_pylist() if n not in parents]


@pytest.mark.parametrize("agent", ["verifier", "prover"])
def test_threshold_selection_picks_leaves_at_or_above_threshold(ei_tree, agent):
    ei = PureTextEiParameters(reward_threshold=0.9)
    text_rl = TextRlParameters()
    rows = export.sft_rows(
        ei_tree.nodes,
        ei_tree.rewards,
        ei_tree.export,
        [agent],
        ei_tree.ctx.agent_names,
        ei,
        text_rl,
        run_seed=1,
    )
    leaves = _leaves(ei_tree)
    assert len(leaves) == 24  # one rollout per datapoint with K = 1
    expected = {
        leaf
        for leaf in leaves
        if _episode_reward(ei_tree, leaf, agent) >= 0.9 and _spoke(ei_tree, leaf, agent)
    }
    assert 0 < len(expected) < 24
    assert {r["leaf_node_id"] for r in rows} == expected
    for row in rows:
        assert row["agent"] == agent and not row["guess_replaced"]
        assert row["episode_reward"] == _episode_reward(ei_tree, row["leaf_node_id"], agent)
        assert row["messages"][0]["role"] == "system"
        last = row["messages"][-1]
        assert last["role"] == "assistant"
    table = export.sft_table(rows)
    assert table.schema == schemas.SFT and table.num_rows == len(rows)
    assert export.sft_openai_jsonl(rows)[0] == {"messages": rows[0]["openai_messages"]}


def _weighted(**changes) -> PureTextEiParameters:
    return replace(PureTextEiParameters(rollout_selection_method="weighted_sampling"), **changes)


def test_weighted_sampling_size_and_determinism():
    rewards = np.array([1.0, -1.0, 0.0, 1.0, -1.0, 1.0, 0.5])
    ei = _weighted(weighting_sample_size_factor=0.5)
    first = export.select_rollouts(rewards, ei, np.random.default_rng(5))
    assert len(first) == round(7 * 0.5)
    again = export.select_rollouts(rewards, ei, np.random.default_rng(5))
    assert first.tolist() == again.tolist()
    big = export.select_rollouts(
        rewards, _weighted(weighting_sample_size_factor=3.0), np.random.default_rng(0)
    )
    assert len(big) == 21 and big.tolist() == sorted(big.tolist())


def test_weighted_sampling_prefers_high_rewards():
    """With minimum 0 and a tiny epsilon, negative rewards get (almost) no weight."""
    rewards = np.array([-1.0, -1.0, 1.0, -1.0])
    ei = _weighted(weighting_minimum=0.0, weighting_epsilon=1e-12, weighting_sample_size_factor=25)
    picks = export.select_rollouts(rewards, ei, np.random.default_rng(1))
    assert len(picks) == 100 and set(picks.tolist()) == {2}


def test_weighted_sampling_with_equal_rewards_is_uniform_and_finite():
    rewards = np.full(6, 0.5)
    ei = _weighted(weighting_sample_size_factor=100, weighting_epsilon=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        picks = export.select_rollouts(rewards, ei, np.random.default_rng(2))
    assert len(picks) == 600
    counts = np.bincount(picks, minlength=6)
    assert counts.min() > 60  # every rollout drawn, about 100 times each
    assert export.select_rollouts(np.zeros(0), ei, np.random.default_rng(2)).size == 0


def test_weighted_sampling_without_replacement_draws_distinct_rollouts():
    rewards = np.arange(10, dtype=float)
    ei = _weighted(weighting_use_replacement=False, weighting_sample_size_factor=0.8)
    picks = export.select_rollouts(rewards, ei, np.random.default_rng(4))
    assert len(picks) == 8 and len(set(picks.tolist())) == 8


def test_weighted_sampling_without_replacement_too_large_is_a_clear_error():
    ei = _weighted(weighting_use_replacement=False, weighting_sample_size_factor=1.5)
    with pytest.raises(ValueError, match="weighting_sample_size_factor"):
        export.select_rollouts(np.arange(4, dtype=float), ei, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("annealing", "iteration", "expected"),
    [
        ("none", 3, 0.5),
        ("linear", 3, 0.5 - 3 * 0.1),
        ("linear", 10, 0.0),
        ("exponential", 3, 0.5 * 0.9**3),
        ("exponential", 0, 0.5),
    ],
)
def test_guess_replacement_proportion_annealing(annealing, iteration, expected):
    text_rl = TextRlParameters(
        verifier_guess_replacement_proportion=0.5,
        verifier_guess_replacement_annealing=annealing,
        verifier_guess_replacement_annealing_rate=0.1,
    )
    assert export.guess_replacement_proportion(text_rl, iteration) == pytest.approx(expected)


@pytest.mark.parametrize(("annealing", "proportion"), [("none", 0.5), ("linear", 0.2)])
def test_guess_replaced_rows_end_with_the_correct_decision(ei_tree, annealing, proportion):
    text_rl = TextRlParameters(
        verifier_guess_replacement_proportion=0.5,
        verifier_guess_replacement_annealing=annealing,
        verifier_guess_replacement_annealing_rate=0.1,
    )
    ei = PureTextEiParameters(reward_threshold=0.9)
    rows = export.sft_rows(
        ei_tree.nodes,
        ei_tree.rewards,
        ei_tree.export,
        ["verifier"],
        ei_tree.ctx.agent_names,
        ei,
        text_rl,
        run_seed=1,
    )
    replaced = [r for r in rows if r["guess_replaced"]]
    selected = [r for r in rows if not r["guess_replaced"]]
    assert len(replaced) == int(proportion * 24)  # iteration 3 of the EI context
    assert not {r["leaf_node_id"] for r in replaced} & {r["leaf_node_id"] for r in selected}
    y_of = {it.datapoint.id: it.datapoint.y for it in ei_tree.items}
    for row in replaced:
        verdict = "accept" if y_of[row["datapoint_id"]] == 1 else "reject"
        assert row["messages"][-1] == {"role": "assistant", "content": f"Decision: {verdict}"}
    assert {y_of[r["datapoint_id"]] for r in replaced} == {0, 1}
    for row in selected:
        assert row["episode_reward"] >= 0.9
    again = export.sft_rows(
        ei_tree.nodes,
        ei_tree.rewards,
        ei_tree.export,
        ["verifier"],
        ei_tree.ctx.agent_names,
        ei,
        text_rl,
        run_seed=1,
    )
    assert again == rows


def test_episode_rewards_and_leaves(ei_tree):
    totals = export.episode_rewards(ei_tree.nodes, ei_tree.rewards, ei_tree.ctx.agent_names)
    node_ids = ei_tree.nodes.column("node_id").to_pylist()
    leaves = export.leaf_indices(ei_tree.nodes)
    assert [node_ids[i] for i in leaves] == _leaves(ei_tree)
    v = ei_tree.ctx.agent_names.index("verifier")
    for i in leaves:
        assert totals[i, v] == _episode_reward(ei_tree, node_ids[i], "verifier")


@pytest.fixture(scope="module")
def solo_tree() -> Tree:
    ctx = make_context("solo_verifier", "pure_text_malt.num_responses_per_timestep=3")
    return Tree(ctx, 10)


def test_malt_guess_replaced_pairs_prefer_the_true_verdict(solo_tree):
    leaves = export.leaf_indices(solo_tree.nodes)
    assert len(leaves) == 30  # 10 episodes x 3 sampled verdicts
    none = TextRlParameters(verifier_guess_replacement_proportion=0.0)
    assert verifier_rows.guess_replaced_pairs(solo_tree.nodes, solo_tree.export, none, 1) == []
    y_of = {it.datapoint.id: it.datapoint.y for it in solo_tree.items}
    # one pair per distinct chat: the 3 sampled verdicts of an episode share theirs
    accepts = sum(y_of[solo_tree.items[i].datapoint.id] for i in range(10))
    assert 0 < accepts < 10, "the fixture needs both labels"

    def chosen_counts(rows):
        return collections.Counter(r["chosen"][0]["content"] for r in rows)

    half = TextRlParameters(verifier_guess_replacement_proportion=0.5)
    rows = verifier_rows.guess_replaced_pairs(solo_tree.nodes, solo_tree.export, half, 1)
    each = min(5 // 2, accepts, 10 - accepts)  # half the share per label, as far as it goes
    assert chosen_counts(rows) == {"Decision: accept": each, "Decision: reject": each}
    assert rows == verifier_rows.guess_replaced_pairs(solo_tree.nodes, solo_tree.export, half, 1)
    assert rows != verifier_rows.guess_replaced_pairs(solo_tree.nodes, solo_tree.export, half, 2)
    every = TextRlParameters(verifier_guess_replacement_proportion=1.0)
    all_rows = verifier_rows.guess_replaced_pairs(solo_tree.nodes, solo_tree.export, every, 1)
    each = min(accepts, 10 - accepts)  # balanced: the rarer label sets the count
    assert chosen_counts(all_rows) == {"Decision: accept": each, "Decision: reject": each}
    assert len({r["datapoint_id"] for r in all_rows}) == len(all_rows)  # no duplicate pair
    sampled = {
        r["parent_node_id"]: r["prompt"]
        for r in export.dpo_rows(solo_tree.nodes, solo_tree.pairs(), solo_tree.export)
        if r["agent"] == "verifier"
    }
    assert {r["parent_node_id"] for r in rows} & set(sampled), "nothing to compare prompts with"
    for row in rows:
        truth, false = (
            ("accept", "reject") if y_of[row["datapoint_id"]] == 1 else ("reject", "accept")
        )
        assert row["chosen"] == [{"role": "assistant", "content": f"Decision: {truth}"}]
        assert row["rejected"] == [{"role": "assistant", "content": f"Decision: {false}"}]
        assert row["guess_replaced"] and row["chosen_node_id"] is None
        if row["parent_node_id"] in sampled:  # the same chat the sampled answers came from
            assert row["prompt"] == sampled[row["parent_node_id"]]
    table = export.dpo_table(rows)
    assert table.schema == schemas.DPO
    assert table.column("guess_replaced").to_pylist() == [True] * len(rows)


def test_alternate_verdicts_parses_sampled_replies_as_the_rewards_do():
    """Sampled verdicts ("Decision: Accept.") alternate like written ones; a reply without a
    verdict goes last. (Matching the written text only left every sampled pair unalternated.)"""

    def row(name: str, reply: str) -> dict:
        return {"name": name, "chosen": [{"role": "assistant", "content": reply}]}

    rows = [
        row("r1", "Decision: reject"),
        row("r2", "The loop is empty. Decision: REJECT."),
        row("n1", "I am not sure."),
        row("r3", "**Decision:** Reject"),
        row("a1", "Decision: Accept."),
        row("a2", "Decision: accept"),
    ]
    order = [r["name"] for r in export.alternate_verdicts(rows, "chosen")]
    assert order == ["a1", "r1", "a2", "r2", "r3", "n1"]


def test_malt_label_pairs_skip_chats_an_early_verdict_ended():
    """Under `early_decision_ends_episode` a round-0 verdict ends the episode penalised; a label
    pair after that chat would teach the verifier to decide there, so only chats that reached
    a round where a verdict counts get one."""
    rules = ("nip_protocol.max_message_rounds=3", "nip_protocol.min_message_rounds=3")
    every = TextRlParameters(verifier_guess_replacement_proportion=1.0)
    rounds_of = {}
    for ends in (False, True):
        tree = Tree(
            make_context("nip", *rules, f"protocol_common.early_decision_ends_episode={ends}"), 12
        )
        terminated = np.array(tree.nodes["terminated"].to_pylist(), dtype=bool)
        early = terminated & (np.array(tree.nodes["round"].to_pylist()) == 0)
        ids, rounds = tree.nodes["node_id"].to_pylist(), tree.nodes["round"].to_pylist()
        round_of = dict(zip(ids, rounds, strict=True))
        rows = verifier_rows.guess_replaced_pairs(tree.nodes, tree.export, every, 1)
        rounds_of[ends] = collections.Counter(round_of[r["parent_node_id"]] for r in rows)
        assert early.any() == ends, "the dummy verifier gives some round-0 verdicts"
        questions = verifier_rows.early_question_pairs(tree.nodes, tree.export, rows)
        if not ends:
            assert questions == []
            continue
        # one per first-turn chat, the round-0 question over the verdict the label pair prefers
        assert len(questions) == len({r["datapoint_id"] for r in rows}) > 0
        label_of = {r["datapoint_id"]: r["chosen"] for r in rows}
        for row in questions:
            assert (
                round_of[row["chosen_node_id"]] == 0
                and row["parent_node_id"] == row["chosen_node_id"].rsplit(".", 1)[0]
            )
            assert row["rejected"] == label_of[row["datapoint_id"]]
            assert parse_decision(row["chosen"][0]["content"]) is None
            assert len(row["openai_prompt"]) < min(len(r["openai_prompt"]) for r in rows)
    # the verdict turn is round 2: its chat's parent is the prover's round-1 node
    assert set(rounds_of[False]) == {1} and set(rounds_of[True]) == {1}


def test_a_label_pair_stands_at_the_verdict_turn_where_the_verdict_failed_to_parse():
    """A verifier that asks in round 0 and writes an unparsable verdict in round 2: the label
    pair is placed after the round-2 chat it was shown (the prover's answer in it), not after
    its last parsed reply, the round-0 question, where a verdict cannot count."""
    ctx = make_context(
        "nip",
        "nip_protocol.max_message_rounds=3",
        "nip_protocol.min_message_rounds=3",
        "protocol_common.early_decision_ends_episode=true",
        "agents.verifier.num_invalid_generation_retries=0",
    )

    class AsksThenFails:
        async def complete(self, messages, model, n, sampling):
            last_turn = "no questions left" in messages[-1]["content"]
            return ["Decision: Decision: Decision" if last_turn else "Which input breaks it?"] * n

    items = make_items(4)
    settings = rollout_settings(ctx, {a: AsksThenFails() for a in ctx.agent_names})
    nodes = asyncio.run(grow_trees(items, settings))
    assert all(r["failure"] for r in nodes.to_pylist() if r["round"] == 2)
    context = export.ExportContext(
        ctx.protocol, ctx.agent_params, {it.batch_index: it for it in items}, ctx.iteration
    )
    every = TextRlParameters(verifier_guess_replacement_proportion=1.0)
    rows = verifier_rows.guess_replaced_pairs(nodes, context, every, 1)
    assert len({r["datapoint_id"] for r in rows}) == len(rows) == 4  # 2 per label, one each
    for row in rows:
        assert "no questions left" in row["openai_prompt"][-1]["content"]
        assert any("Which input breaks it?" in m["content"] for m in row["openai_prompt"])
