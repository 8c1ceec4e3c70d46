"""Expected reward of every node of a rollout forest, per agent (MALT value estimation).

Each node of a MALT tree is one joint response of the agents active in that round; the value of
a node estimates the reward an agent can expect after that response. Two estimators:

* `monte_carlo` (our default): value(node) = step_reward(node) + mean over children of
  value(child); a leaf's value is its step reward. Each child branch counts equally, whatever
  happens below it, which is the unbiased Monte-Carlo estimate of the sampled subtree.
* `leaf_average` (nip's estimator, for comparison): total(node) = step_reward(node) + sum of the
  children's totals, divided by the number of leaves below the node. On balanced trees the two
  agree when only leaves carry reward; on ragged trees (a branch that ended early has one leaf,
  a continuing branch K**d leaves) `leaf_average` weights each child by its number of leaves, so
  branches that continue dominate those that ended, and a step reward on an inner node is added
  once rather than to every leaf.

Everything is vectorised: per tree level (deepest first) the children are grouped by parent and\nsummed one family size at a time (see `tree_arrays.sibling_buckets`); no per-node Python loop.

Example:
    >>> import numpy as np
    >>> parent = np.array([-1, 0, 0, 1, 1])
    >>> depth = np.array([0, 1, 1, 2, 2])
    >>> reward = np.array([[0.0], [0.0], [1.0], [0.0], [1.0]])
    >>> expected_rewards(parent, depth, reward)[:, 0].tolist()
    [0.75, 0.5, 1.0, 0.0, 1.0]
    >>> expected_rewards(parent, depth, reward, "leaf_average")[:, 0].round(4).tolist()
    [0.6667, 0.5, 1.0, 0.0, 1.0]
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from nip_core.malt.tree_arrays import (
    as_node_matrix,
    as_parent_array,
    check_depth,
    children_counts,
    column_sum,
    level_nodes,
    sibling_buckets,
)

ValueMethod = Literal["monte_carlo", "leaf_average"]
VALUE_METHODS: tuple[str, ...] = ("monte_carlo", "leaf_average")

__all__ = ["VALUE_METHODS", "ValueMethod", "expected_rewards"]


def expected_rewards(
    parent: np.ndarray,
    depth: np.ndarray,
    step_reward: np.ndarray,
    method: ValueMethod = "monte_carlo",
) -> np.ndarray:
    """Expected reward of every node for every agent.

    Args:
        parent: int64[N], parent index of each node (-1 for roots); parents precede children.
        depth: int[N], 0 for roots, parent's depth + 1 otherwise.
        step_reward: float64[N, A], reward each agent earned at each node.
        method: `"monte_carlo"` (mean over children) or `"leaf_average"` (nip: subtree total
            divided by the number of leaves below); see the module docstring for why they differ.

    Returns:
        float64[N, A] values (a transposed view of an agent-major array, so each agent's column
        is contiguous); the inputs are not modified.
    """
    if method not in VALUE_METHODS:
        raise ValueError(
            f"unknown expected-reward method {method!r}; expected one of {VALUE_METHODS}"
        )
    parent = as_parent_array(parent)
    depth = check_depth(parent, depth)
    reward = as_node_matrix(step_reward, parent.size, "step_reward", np.float64)
    if method == "monte_carlo":
        return _monte_carlo(parent, depth, reward)
    return _leaf_average(parent, depth, reward)


def _monte_carlo(parent: np.ndarray, depth: np.ndarray, reward: np.ndarray) -> np.ndarray:
    """value = step reward + mean of children's values, filled from the deepest level up."""
    value = np.array(
        reward.T, order="C"
    )  # a copy, agent-major [A, N]: each agent's row is contiguous
    levels = level_nodes(depth)
    for d in range(len(levels) - 1, 0, -1):
        nodes, buckets = sibling_buckets(parent, levels[d])
        child_value = value[:, nodes]
        for bucket in buckets:
            value[:, bucket.owner_index] += column_sum(bucket.rows(child_value)) / bucket.size
    return value.T


def _leaf_average(parent: np.ndarray, depth: np.ndarray, reward: np.ndarray) -> np.ndarray:
    """nip's estimator: subtree reward total over the number of leaves below."""
    total = np.array(reward.T, order="C")  # a copy, agent-major [A, N]
    leaves = (children_counts(parent, parent.size) == 0).astype(np.float64)
    levels = level_nodes(depth)
    for d in range(len(levels) - 1, 0, -1):
        nodes, buckets = sibling_buckets(parent, levels[d])
        child_total, child_leaves = total[:, nodes], leaves[nodes]
        for bucket in buckets:
            owner = bucket.owner_index
            total[:, owner] += column_sum(bucket.rows(child_total))
            leaves[owner] += column_sum(bucket.rows(child_leaves))
    return (total / leaves).T
