"""Nodes table -> rewards table and pairs table, on small hand-built trees.

The main tree (agents prover, verifier; y = 1, the prover is paid when the verifier accepts):

    b0                 root
    ├── b0.0           r0  verifier asks             (p 0, v 0)
    │   ├── b0.0.0     r1  prover answers            (p 0, v 0)
    │   │   ├── b0.0.0.0  r2  verifier accepts       (p 1, v +1)
    │   │   └── b0.0.0.1  r2  verifier rejects       (p 0, v -1)
    │   └── b0.0.1     r1  prover answers            (p 0, v 0)
    │       └── b0.0.1.0  r2  verifier accepts       (p 1, v +1)
    └── b0.1           r0  verifier rejects at once  (p 0, v -1)

Monte Carlo (step reward + mean of the children's values):
    verifier: b0.0.0 = (1 - 1)/2 = 0, b0.0.1 = 1, b0.0 = (0 + 1)/2 = 0.5, b0.1 = -1,
              b0 = (0.5 - 1)/2 = -0.25
    prover:   b0.0.0 = (1 + 0)/2 = 0.5, b0.0.1 = 1, b0.0 = 0.75, b0.1 = 0, b0 = 0.375
Leaf average (subtree reward total / leaves below):
    verifier: b0.0.0 = 0/2 = 0, b0.0.1 = 1, b0.0 = 1/3, b0.1 = -1, b0 = 0/4 = 0
    prover:   b0.0.0 = 1/2, b0.0.1 = 1, b0.0 = 2/3, b0.1 = 0, b0 = 2/4 = 0.5
With thresholds (prover 0.6, verifier 0.0), positive_negative pairs (children where the agent
acted; one positive and one negative needed):
    verifier at b0: b0.0 (0.5) over b0.1 (-1)
    prover at b0.0: b0.0.1 (1) over b0.0.0 (0.5)
    verifier at b0.0.0: b0.0.0.0 (1) over b0.0.0.1 (-1)
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from nip_core.malt import schemas
from nip_core.malt.tree_values import pairs_table, parent_indices, rewards_table

AGENTS = ("prover", "verifier")
THRESHOLDS = (0.6, 0.0)
RANGES = ((0.0, 1.0), (-1.0, 1.0))


def node(node_id, parent, round_, acted, p=0.0, v=0.0, *, ended=False, decision=None, batch=0):
    return {
        "datapoint_id": 40 + batch,
        "batch_index": batch,
        "node_id": node_id,
        "parent_id": parent,
        "round": round_,
        "messages": [],
        "raw_messages": [{"agent": a, "content": f"{a} at {node_id}"} for a in acted],
        "acted": list(acted),
        "decision": decision,
        "y": 1,
        "ended": ended,
        "terminated": False,
        "step_rewards": []
        if round_ < 0
        else [
            {"agent": "prover", "reward": p},
            {"agent": "verifier", "reward": v},
        ],
        "retries": 0,
        "failure": None,
    }


def main_rows() -> list[dict]:
    return [
        node("b0", None, -1, []),
        node("b0.0", "b0", 0, ["verifier"]),
        node("b0.1", "b0", 0, ["verifier"], 0.0, -1.0, ended=True, decision=0),
        node("b0.0.0", "b0.0", 1, ["prover"]),
        node("b0.0.1", "b0.0", 1, ["prover"]),
        node("b0.0.0.0", "b0.0.0", 2, ["verifier"], 1.0, 1.0, ended=True, decision=1),
        node("b0.0.0.1", "b0.0.0", 2, ["verifier"], 0.0, -1.0, ended=True, decision=0),
        node("b0.0.1.0", "b0.0.1", 2, ["verifier"], 1.0, 1.0, ended=True, decision=1),
    ]


def table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schemas.NODES)


def values(rewards: pa.Table, column: str) -> dict[tuple[str, str], object]:
    rows = rewards.to_pylist()
    return {(r["node_id"], r["agent"]): r[column] for r in rows}


MONTE_CARLO = {
    "b0": (0.375, -0.25),
    "b0.0": (0.75, 0.5),
    "b0.1": (0.0, -1.0),
    "b0.0.0": (0.5, 0.0),
    "b0.0.1": (1.0, 1.0),
    "b0.0.0.0": (1.0, 1.0),
    "b0.0.0.1": (0.0, -1.0),
    "b0.0.1.0": (1.0, 1.0),
}
LEAF_AVERAGE = {
    **MONTE_CARLO,
    "b0": (0.5, 0.0),
    "b0.0": (2 / 3, 1 / 3),
}


@pytest.mark.parametrize(
    ("estimator", "expected"), [("monte_carlo", MONTE_CARLO), ("leaf_average", LEAF_AVERAGE)]
)
def test_expected_rewards_per_node_and_agent(estimator, expected):
    rewards = rewards_table(table(main_rows()), AGENTS, THRESHOLDS, estimator)
    assert rewards.schema == schemas.REWARDS
    assert rewards.num_rows == 8 * 2
    got = values(rewards, "expected_reward")
    for node_id, pair in expected.items():
        for agent, value in zip(AGENTS, pair, strict=True):
            assert got[(node_id, agent)] == pytest.approx(value), (node_id, agent)


def test_rewards_table_flags_and_thresholds():
    rewards = rewards_table(table(main_rows()), AGENTS, THRESHOLDS, "monte_carlo")
    rows = rewards.to_pylist()
    assert [(r["node_id"], r["agent"]) for r in rows[:4]] == [
        ("b0", "prover"),
        ("b0", "verifier"),
        ("b0.0", "prover"),
        ("b0.0", "verifier"),
    ]
    active = {key for key, flag in values(rewards, "active").items() if flag}
    assert active == {
        ("b0.0", "verifier"),
        ("b0.1", "verifier"),
        ("b0.0.0", "prover"),
        ("b0.0.1", "prover"),
        ("b0.0.0.0", "verifier"),
        ("b0.0.0.1", "verifier"),
        ("b0.0.1.0", "verifier"),
    }
    assert values(rewards, "reward")[("b0.0.0.0", "prover")] == 1.0
    assert values(rewards, "reward")[("b0.1", "verifier")] == -1.0
    assert {(r["agent"], r["threshold"]) for r in rows} == {("prover", 0.6), ("verifier", 0.0)}
    positive = {key for key, flag in values(rewards, "is_positive").items() if flag}
    assert positive == {
        ("b0.0", "prover"),
        ("b0.0", "verifier"),
        ("b0.0.0", "verifier"),  # 0.0 ties the threshold: positive
        ("b0.0.1", "prover"),
        ("b0.0.1", "verifier"),
        ("b0.0.0.0", "prover"),
        ("b0.0.0.0", "verifier"),
        ("b0.0.1.0", "prover"),
        ("b0.0.1.0", "verifier"),
    }
    assert rewards.column("datapoint_id").to_pylist() == [40] * 16
    assert rewards.column("round").to_pylist()[::2] == [-1, 0, 0, 1, 1, 2, 2, 2]


def make_pairs(rows, method="positive_negative", proportion=0.1, seed=7):
    nodes = table(rows)
    rewards = rewards_table(nodes, AGENTS, THRESHOLDS, "monte_carlo")
    return pairs_table(
        nodes,
        rewards,
        AGENTS,
        method=method,
        reward_midpoints=THRESHOLDS,
        reward_ranges=RANGES,
        interval_threshold_proportion=proportion,
        seed=seed,
    )


EXPECTED_PAIRS = [
    ("prover", "b0.0", "b0.0.1", "b0.0.0", 1.0, 0.5),
    ("verifier", "b0", "b0.0", "b0.1", 0.5, -1.0),
    ("verifier", "b0.0.0", "b0.0.0.0", "b0.0.0.1", 1.0, -1.0),
]


def _pair_keys(pairs: pa.Table) -> list[tuple]:
    return [
        (
            r["agent"],
            r["parent_node_id"],
            r["chosen_node_id"],
            r["rejected_node_id"],
            r["chosen_expected_reward"],
            r["rejected_expected_reward"],
        )
        for r in pairs.to_pylist()
    ]


@pytest.mark.parametrize("method", ["positive_negative", "interval"])
def test_pairs_map_back_to_sibling_node_ids(method):
    pairs = make_pairs(main_rows(), method)
    assert pairs.schema == schemas.PAIRS
    assert _pair_keys(pairs) == EXPECTED_PAIRS
    parent_of = {r["node_id"]: r["parent_id"] for r in main_rows()}
    round_of = {r["node_id"]: r["round"] for r in main_rows()}
    for row in pairs.to_pylist():
        assert parent_of[row["chosen_node_id"]] == row["parent_node_id"]
        assert parent_of[row["rejected_node_id"]] == row["parent_node_id"]
        assert row["round"] == round_of[row["chosen_node_id"]]
        assert row["datapoint_id"] == 40 and row["method"] == method


def test_interval_gap_threshold_scales_with_reward_range():
    """Proportion 0.6: prover gaps must exceed 0.6 (b0.0's 0.5 does not), verifier gaps 1.2."""
    pairs = make_pairs(main_rows(), "interval", proportion=0.6)
    assert _pair_keys(pairs) == EXPECTED_PAIRS[1:]


def test_pairs_across_trees_keep_their_datapoints():
    rows = main_rows() + [
        node("b1", None, -1, [], batch=1),
        node("b1.0", "b1", 0, ["verifier"], 0.0, 1.0, ended=True, decision=1, batch=1),
        node("b1.1", "b1", 0, ["verifier"], 0.0, -1.0, ended=True, decision=0, batch=1),
    ]
    pairs = make_pairs(rows)
    found = {
        (r["parent_node_id"], r["chosen_node_id"], r["datapoint_id"]) for r in pairs.to_pylist()
    }
    assert ("b1", "b1.0", 41) in found and ("b0", "b0.0", 40) in found


def test_random_choice_among_several_positives_is_seeded():
    rows = [node("b0", None, -1, [])] + [
        node(f"b0.{k}", "b0", 0, ["verifier"], 0.0, 1.0 if k < 3 else -1.0, ended=True)
        for k in range(6)
    ]
    first = make_pairs(rows, seed=1)
    assert first.equals(make_pairs(rows, seed=1))
    chosen = {make_pairs(rows, seed=s).column("chosen_node_id")[0].as_py() for s in range(20)}
    assert chosen <= {"b0.0", "b0.1", "b0.2"} and len(chosen) > 1


def test_duplicate_node_ids_are_rejected():
    rows = main_rows()
    rows[4] = {**rows[4], "node_id": "b0.0.0"}
    with pytest.raises(ValueError, match="duplicate node ids"):
        rewards_table(table(rows), AGENTS, THRESHOLDS, "monte_carlo")


def test_unknown_parent_ids_are_rejected():
    rows = main_rows()
    rows[3] = {**rows[3], "parent_id": "b9"}
    with pytest.raises(ValueError, match="parent id that is not a node"):
        parent_indices(table(rows))


def test_parents_must_precede_children():
    rows = main_rows()
    rows[1], rows[3] = rows[3], rows[1]
    with pytest.raises(ValueError, match="not in topological order"):
        rewards_table(table(rows), AGENTS, THRESHOLDS, "monte_carlo")


def test_agents_outside_the_list_are_rejected():
    with pytest.raises(ValueError, match="outside"):
        rewards_table(table(main_rows()), ("verifier",), (0.0,), "monte_carlo")


def test_unknown_estimator_is_rejected():
    with pytest.raises(ValueError, match="unknown expected-reward method"):
        rewards_table(table(main_rows()), AGENTS, THRESHOLDS, "median")
