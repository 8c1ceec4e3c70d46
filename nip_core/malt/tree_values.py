"""From the nodes table to per-(node, agent) values and preference pairs, as Arrow tables.

The arithmetic lives in `expected_reward` and `preference_pairs` (numpy over flat arrays); this
module only converts between the columnar artifacts and those arrays, without a Python loop
per node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from nip_core.malt import schemas
from nip_core.malt.expected_reward import expected_rewards
from nip_core.malt.preference_pairs import is_positive, select_pairs


def _agent_matrix(
    nodes: pa.Table, column: str, agent_names: Sequence[str], value_field: str | None
) -> np.ndarray:
    """Scatter a list column (of agent names or {agent, value} structs) into an (N, A) matrix."""
    lists = nodes.column(column).combine_chunks()
    rows = pc.list_parent_indices(lists).to_numpy()
    flat = pc.list_flatten(lists)
    agents = flat.field("agent") if value_field else flat
    agent_index = pd.Index(list(agent_names)).get_indexer(agents.to_numpy(zero_copy_only=False))
    if (agent_index < 0).any():
        raise ValueError(f"nodes table names an agent outside {list(agent_names)}")
    if value_field:
        matrix = np.zeros((nodes.num_rows, len(agent_names)), dtype=np.float64)
        matrix[rows, agent_index] = flat.field(value_field).to_numpy(zero_copy_only=False)
    else:
        matrix = np.zeros((nodes.num_rows, len(agent_names)), dtype=bool)
        matrix[rows, agent_index] = True
    return matrix


def parent_indices(nodes: pa.Table) -> np.ndarray:
    node_ids = pd.Index(nodes.column("node_id").to_numpy(zero_copy_only=False))
    if not node_ids.is_unique:
        raise ValueError("nodes table has duplicate node ids")
    parent_ids = nodes.column("parent_id").to_numpy(zero_copy_only=False)
    parent = node_ids.get_indexer(parent_ids)
    has_parent = pd.notna(parent_ids)
    if (parent[has_parent] < 0).any():
        raise ValueError("nodes table has a parent id that is not a node")
    parent = np.where(has_parent, parent, -1).astype(np.int64)
    if (parent >= np.arange(len(parent))).any():
        raise ValueError("nodes table is not in topological order (a parent after its child)")
    return parent


def node_keys(nodes: pa.Table) -> np.ndarray:
    """Stable 64-bit keys of node ids (pandas' fixed-key SipHash, identical in every process)."""
    ids = nodes.column("node_id").to_numpy(zero_copy_only=False)
    return pd.util.hash_array(np.asarray(ids, dtype=object), categorize=False)


def rewards_table(
    nodes: pa.Table,
    agent_names: Sequence[str],
    reward_midpoints: Sequence[float],
    estimator: str,
) -> pa.Table:
    """One row per (node, agent): step reward, expected reward, threshold, positivity."""
    parent = parent_indices(nodes)
    depth = (nodes.column("round").to_numpy() + 1).astype(np.int32)
    step = _agent_matrix(nodes, "step_rewards", agent_names, "reward")
    acted = _agent_matrix(nodes, "acted", agent_names, None)
    value = expected_rewards(parent, depth, step, method=estimator)
    threshold = np.asarray(reward_midpoints, dtype=np.float64)
    positive = is_positive(value, threshold)
    n, a = value.shape
    return pa.table(
        {
            "datapoint_id": np.repeat(nodes.column("datapoint_id").to_numpy(), a),
            "node_id": np.repeat(nodes.column("node_id").to_numpy(zero_copy_only=False), a),
            "round": np.repeat(nodes.column("round").to_numpy(), a),
            "agent": np.tile(np.asarray(agent_names, dtype=object), n),
            "active": acted.reshape(-1),
            "reward": step.reshape(-1),
            "expected_reward": value.reshape(-1),
            "threshold": np.tile(threshold, n),
            "is_positive": positive.reshape(-1),
        },
        schema=schemas.REWARDS,
    )


def pairs_table(
    nodes: pa.Table,
    rewards: pa.Table,
    agent_names: Sequence[str],
    *,
    method: str,
    reward_midpoints: Sequence[float],
    reward_ranges: Sequence[tuple[float, float]],
    interval_threshold_proportion: float,
    seed: int,
    pairs_per_parent: str = "one",
) -> pa.Table:
    """At most one (chosen, rejected) sibling pair per (parent node, agent), or all of them."""
    a = len(agent_names)
    value = rewards.column("expected_reward").to_numpy().reshape(-1, a)
    acted = rewards.column("active").to_numpy(zero_copy_only=False).reshape(-1, a)
    ranges = np.asarray(reward_ranges, dtype=np.float64).reshape(a, 2)
    pairs = select_pairs(
        parent_indices(nodes),
        value,
        acted,
        method=method,
        threshold=np.asarray(reward_midpoints, dtype=np.float64),
        reward_min=ranges[:, 0],
        reward_max=ranges[:, 1],
        interval_threshold_proportion=interval_threshold_proportion,
        node_key=node_keys(nodes),
        seed=seed,
        pairs_per_parent=pairs_per_parent,
    )
    node_ids = nodes.column("node_id").to_numpy(zero_copy_only=False)
    rounds = nodes.column("round").to_numpy()
    return pa.table(
        {
            "agent": np.asarray(agent_names, dtype=object)[pairs.agent],
            "datapoint_id": nodes.column("datapoint_id").to_numpy()[pairs.parent],
            "round": rounds[pairs.chosen],
            "parent_node_id": node_ids[pairs.parent],
            "chosen_node_id": node_ids[pairs.chosen],
            "rejected_node_id": node_ids[pairs.rejected],
            "chosen_expected_reward": value[pairs.chosen, pairs.agent],
            "rejected_expected_reward": value[pairs.rejected, pairs.agent],
            "method": np.full(len(pairs.agent), method, dtype=object),
        },
        schema=schemas.PAIRS,
    )


def balance_pairs_by_label(
    pairs: pa.Table,
    nodes: pa.Table,
    agent: str,
    seed: int,
    spare_settled: bool = False,
    true_labels: Mapping[object, int] | None = None,
) -> pa.Table:
    """`pairs` with `agent`'s pairs cut to as many from problems whose code is correct (y = 1)
    as from problems whose code is buggy (y = 0): a seeded draw keeps that many of the larger
    side. Other agents' pairs and the table's order are kept. Any table of rows under a parent
    node (`agent`, `parent_node_id`) is balanced so, KTO's marked replies too.

    A verifier that mostly accepts gives many "accept on correct code" pairs and few "reject on
    buggy code" ones; DPO on that imbalance moves the verdict's bias rather than the judgement.
    With `spare_settled`, a label whose every rollout ended in the right verdict
    (`settled_labels`) does not count: it gives no pairs because there is nothing to correct, and
    the other label's pairs are kept whole rather than dropped for its want of them.

    `true_labels` (datapoint id -> label before a shuffle) is for the shuffled-label control:
    its pairs are cut to as many in each (shown label, true label) cell, so the pairs it trains
    on agree with the truth exactly as often as they disagree. A permutation alone leaves them
    agreeing by chance more or less often (21 of 48 on one test seed, where the control then
    learned the reverse of the task: AUC 0.17).
    """
    y_of = dict(
        zip(
            nodes.column("node_id").to_pylist(),
            nodes.column("y").to_pylist(),
            strict=True,
        )
    )
    is_agent = np.asarray(pairs.column("agent").to_pylist(), dtype=object) == agent
    parents = pairs.column("parent_node_id").to_pylist()
    y = np.array([y_of[node] for node in parents], dtype=int)
    spared = settled_labels(nodes) if spare_settled else frozenset()
    if true_labels is not None:
        cell = y + 2 * truth_of_parents(parents, nodes, true_labels)
        spared = frozenset(code for code in range(4) if code % 2 in spared)
        keep = label_balanced_mask(is_agent, cell, seed, spared, values=range(4))
        return pairs.filter(pa.array(keep))
    return pairs.filter(pa.array(label_balanced_mask(is_agent, y, seed, spared)))


def truth_of_parents(
    parents: list, nodes: pa.Table, true_labels: Mapping[object, int]
) -> np.ndarray:
    """The label before the shuffle of each parent node's datapoint."""
    datapoint_of = dict(
        zip(
            nodes.column("node_id").to_pylist(),
            nodes.column("datapoint_id").to_pylist(),
            strict=True,
        )
    )
    missing = {datapoint_of[p] for p in parents if datapoint_of[p] not in true_labels}
    if missing:
        raise ValueError(
            f"no label before the shuffle for datapoints {sorted(missing, key=str)[:5]}: the "
            "control's true labels must come from the same train split as its batch"
        )
    return np.array([true_labels[datapoint_of[p]] for p in parents], dtype=int)


def settled_labels(nodes: pa.Table) -> frozenset[int]:
    """The labels (y) whose rollouts all ended in the verdict that label asks for: leaves of the
    tree (nodes no other node descends from) with that y, every one decided right."""
    parents = set(nodes.column("parent_id").drop_null().to_pylist())
    is_leaf = np.array([node not in parents for node in nodes.column("node_id").to_pylist()])
    decision = nodes.column("decision").fill_null(-1).to_numpy()[is_leaf]
    y = nodes.column("y").to_numpy()[is_leaf]
    return frozenset(
        label for label in (0, 1) if (y == label).any() and (decision[y == label] == label).all()
    )


def label_balanced_mask(
    selected: np.ndarray,
    y: np.ndarray,
    seed: int,
    spared: frozenset[int] = frozenset(),
    values: Sequence[int] = (0, 1),
) -> np.ndarray:
    """bool mask over rows: every row outside `selected`, and of the selected ones as many of
    each of `values` in `y` (the labels, or the control's four cells) as of the rarest (all of
    the rarest, a seeded draw of the others; none where one is missing). A value in `spared`
    does not set the count; with every value spared, all rows are kept."""
    rng = np.random.default_rng(seed)
    by_value = [np.flatnonzero(selected & (y == value)) for value in values]
    counted = [
        len(rows) for value, rows in zip(values, by_value, strict=True) if value not in spared
    ]
    each = min(counted) if counted else len(y)
    keep = ~selected
    for rows in by_value:
        keep[rng.permutation(rows)[:each]] = True
    return keep
