"""Group-relative marking of sampled replies: the rows of MALT's KTO objective.

Every parent node's children are the K replies an agent sampled for the same turn. A reply
whose expected reward is above its siblings' mean is desirable, one below it undesirable, one
at the mean says nothing (the sign of a GRPO advantage). Of each (parent, agent) family at most
`rows_per_parent` replies are kept, half of each kind where there are enough, drawn with the
run's seed, so a rerun or resume keeps the same rows.

Example:
    >>> import numpy as np
    >>> parent = np.array([-1, 0, 0, 0])
    >>> value = np.array([[0.0], [1.0], [-1.0], [-1.0]])
    >>> acted = np.array([[False], [True], [True], [True]])
    >>> rows = marked_replies(parent, value, acted, rows_per_parent=2, seed=0)
    >>> rows.node.tolist(), rows.desirable.tolist()
    ([1, 2], [True, False])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from nip_core.malt.tree_values import parent_indices


@dataclass(frozen=True, eq=False)
class MarkedReplies:
    """Parallel arrays, one entry per kept reply, sorted by (agent, parent, node)."""

    agent: np.ndarray
    parent: np.ndarray
    node: np.ndarray
    advantage: np.ndarray  # expected reward minus the siblings' mean (its own included)
    desirable: np.ndarray


def marked_replies(
    parent: np.ndarray, value: np.ndarray, acted: np.ndarray, rows_per_parent: int, seed: int
) -> MarkedReplies:
    """The kept replies of every family of two or more siblings the agent acted in."""
    rng = np.random.default_rng(seed)
    parent = np.asarray(parent)
    kept: list[tuple[int, int, int, float]] = []
    for agent in range(value.shape[1]):
        children = np.flatnonzero((parent >= 0) & acted[:, agent])
        for family_parent in np.unique(parent[children]):
            family = children[parent[children] == family_parent]
            if family.size < 2:
                continue
            advantage = value[family, agent] - value[family, agent].mean()
            for at in _half_of_each_kind(advantage, rows_per_parent, rng):
                kept.append((agent, int(family_parent), int(family[at]), float(advantage[at])))
    table = np.array([row[:3] for row in kept], dtype=np.int64).reshape(-1, 3)
    advantage = np.array([row[3] for row in kept], dtype=np.float64)
    return MarkedReplies(table[:, 0], table[:, 1], table[:, 2], advantage, advantage > 0)


def _half_of_each_kind(advantage: np.ndarray, count: int, rng: np.random.Generator) -> list[int]:
    """Positions of up to `count` family members, in order, as evenly desirable and undesirable
    as the family allows."""
    good = rng.permutation(np.flatnonzero(advantage > 0))
    bad = rng.permutation(np.flatnonzero(advantage < 0))
    n_good = min(good.size, max(count - bad.size, count // 2))
    n_bad = min(bad.size, count - n_good)
    return sorted([*good[:n_good].tolist(), *bad[:n_bad].tolist()])


def marked_replies_table(
    nodes: pa.Table,
    rewards: pa.Table,
    agent_names: Sequence[str],
    rows_per_parent: int,
    seed: int,
) -> pa.Table:
    """`marked_replies` of an iteration's trees as a table: agent, datapoint, round, parent and
    node ids, expected reward, advantage, desirable."""
    a = len(agent_names)
    value = rewards.column("expected_reward").to_numpy().reshape(-1, a)
    acted = rewards.column("active").to_numpy(zero_copy_only=False).reshape(-1, a)
    rows = marked_replies(parent_indices(nodes), value, acted, rows_per_parent, seed)
    node_ids = nodes.column("node_id").to_numpy(zero_copy_only=False)
    return pa.table(
        {
            "agent": np.asarray(agent_names, dtype=object)[rows.agent].tolist(),
            "datapoint_id": nodes.column("datapoint_id").to_numpy()[rows.node],
            "round": nodes.column("round").to_numpy()[rows.node],
            "parent_node_id": node_ids[rows.parent].tolist(),
            "node_id": node_ids[rows.node].tolist(),
            "expected_reward": value[rows.node, rows.agent],
            "advantage": rows.advantage,
            "desirable": rows.desirable,
        }
    )
