"""Iteration summary statistics: verifier metrics over leaves and per-agent pair counts.

Hand-built forest (agents prover, verifier):

    b0 (y=1)                         b1 (y=0)
    ├── b0.0        r0 question      └── b1.0  r0 accepts (wrong, v -1)
    │   ├── b0.0.0  r1 accepts (right, v +1)
    │   └── b0.0.1  r1 invalid, terminated (v -1)
    └── b0.1        r0 rejects (wrong, v -1)

Leaves: b0.0.0 accept/1, b0.0.1 none/1, b0.1 reject/1, b1.0 accept/0.
accuracy = 1/4 (only b0.0.0), precision = 1/2 (two accepts, one right),
recall = 1/3 (three correct solutions, one accepted), decision rate = 3/4.
Non-terminal nodes: b0, b0.0, b1 = 3; two verifier pairs -> pair proportion 2/3.
Verifier values (Monte Carlo) where it acted: b0.0 = (1 - 1)/2 = 0, 1, -1, -1 -> mean -0.25.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pyarrow as pa
import pytest

from nip_core.malt import schemas
from nip_core.malt.iteration_stats import iteration_stats, leaf_decisions, verifier_metrics
from nip_core.malt.tree_values import rewards_table

AGENTS = ("prover", "verifier")


def node(
    node_id, parent, round_, *, y=1, v=0.0, decision=None, ended=False, acted=True, failure=None
):
    batch = int(node_id.split(".")[0][1:])
    return {
        "datapoint_id": 70 + batch,
        "batch_index": batch,
        "node_id": node_id,
        "parent_id": parent,
        "round": round_,
        "messages": [],
        "raw_messages": [],
        "acted": ["verifier"] if acted and round_ >= 0 else [],
        "decision": decision,
        "y": y,
        "ended": ended,
        "terminated": ended and decision is None,
        "step_rewards": []
        if round_ < 0
        else [{"agent": "prover", "reward": 0.0}, {"agent": "verifier", "reward": v}],
        "retries": 0,
        "failure": failure,
    }


def forest() -> pa.Table:
    rows = [
        node("b0", None, -1),
        node("b1", None, -1, y=0),
        node("b0.0", "b0", 0),
        node("b0.1", "b0", 0, v=-1.0, decision=0, ended=True),
        node("b1.0", "b1", 0, y=0, v=-1.0, decision=1, ended=True),
        node("b0.0.0", "b0.0", 1, v=1.0, decision=1, ended=True),
        node("b0.0.1", "b0.0", 1, v=-1.0, ended=True, acted=False, failure="verifier: invalid"),
    ]
    return pa.Table.from_pylist(rows, schema=schemas.NODES)


def pairs(agents: list[str]) -> pa.Table:
    rows = [
        {
            "agent": agent,
            "datapoint_id": 70,
            "round": 0,
            "parent_node_id": "b0",
            "chosen_node_id": "b0.0",
            "rejected_node_id": "b0.1",
            "chosen_expected_reward": 0.0,
            "rejected_expected_reward": -1.0,
            "method": "positive_negative",
        }
        for agent in agents
    ]
    return pa.Table.from_pylist(rows, schema=schemas.PAIRS)


def test_verifier_metrics_count_missing_decisions_as_wrong():
    decisions = np.array([1, 0, -1, 1, 0])
    labels = np.array([1, 0, 1, 0, 1])
    assert verifier_metrics(decisions, labels) == pytest.approx(
        {"accuracy": 2 / 5, "precision": 1 / 2, "recall": 1 / 3, "decision_rate": 4 / 5}
    )


def test_undefined_metrics_are_none_not_nan():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        no_accepts = verifier_metrics(np.array([0, -1]), np.array([0, 0]))
        empty = verifier_metrics(np.zeros(0, dtype=int), np.zeros(0, dtype=int))
    assert no_accepts["precision"] is None and no_accepts["recall"] is None
    assert no_accepts["accuracy"] == 0.5
    assert all(value is None for value in empty.values())


def test_leaf_decisions_use_minus_one_for_no_decision():
    decisions, labels, rounds = leaf_decisions(forest())
    assert decisions.tolist() == [0, 1, 1, -1]
    assert labels.tolist() == [1, 0, 1, 1]
    assert rounds.tolist() == [0, 0, 1, 1]


def test_iteration_stats_on_hand_built_forest():
    nodes = forest()
    rewards = rewards_table(nodes, AGENTS, (0.5, 0.0), "monte_carlo")
    stats = iteration_stats(nodes, rewards, pairs(["verifier", "verifier"]), AGENTS)
    assert stats["datapoints"] == 2 and stats["nodes"] == 7
    assert stats["nodes_per_datapoint"] == 3.5
    assert stats["non_terminal_nodes"] == 3
    assert stats["rollouts"] == 4
    assert stats["mean_episode_rounds"] == 1.5
    assert stats["failures"] == 1
    assert stats["verifier"] == pytest.approx(
        {"accuracy": 1 / 4, "precision": 1 / 2, "recall": 1 / 3, "decision_rate": 3 / 4}
    )
    verifier, prover = stats["agents"]["verifier"], stats["agents"]["prover"]
    assert verifier["pairs"] == 2 and verifier["pairs_per_datapoint"] == 1.0
    assert verifier["pair_proportion"] == pytest.approx(2 / 3)
    assert verifier["active_nodes"] == 4
    assert verifier["mean_expected_reward"] == pytest.approx(-0.25)
    assert prover["pairs"] == 0 and prover["pair_proportion"] == 0.0
    assert prover["active_nodes"] == 0 and prover["mean_expected_reward"] is None
    text = json.dumps(stats, allow_nan=False)  # plain Python numbers, no NaN
    assert not math.isnan(json.loads(text)["verifier"]["accuracy"])


def test_iteration_stats_without_pairs():
    nodes = forest()
    rewards = rewards_table(nodes, AGENTS, (0.5, 0.0), "monte_carlo")
    stats = iteration_stats(nodes, rewards, None, AGENTS)
    assert {a: s["pairs"] for a, s in stats["agents"].items()} == {"prover": 0, "verifier": 0}
    json.dumps(stats, allow_nan=False)


def test_empty_iteration_has_no_undefined_numbers():
    nodes = pa.Table.from_pylist([], schema=schemas.NODES)
    rewards = rewards_table(nodes, AGENTS, (0.5, 0.0), "monte_carlo")
    stats = iteration_stats(nodes, rewards, pairs([]), AGENTS)
    assert stats["rollouts"] == 0 and stats["mean_episode_rounds"] is None
    assert stats["verifier"]["accuracy"] is None
    assert stats["agents"]["verifier"]["pair_proportion"] is None
    json.dumps(stats, allow_nan=False)
