"""Preference-pair selection over a rollout forest (MALT's DPO data).

For every parent node (roots included, so round-0 responses are trained too) and every agent,
the candidates are the children in which that agent acted. Each (parent, agent) contributes at
most one (chosen, rejected) pair of sibling children:

* `positive_negative`: a child is positive for an agent iff its value >= the agent's threshold
  (ties count as positive). If both kinds exist, one positive and one negative candidate are
  drawn uniformly at random.
* `interval`: among the unordered candidate pairs whose value gap is strictly greater than
  `interval_threshold_proportion * (reward_max - reward_min)` for that agent, one pair is drawn
  uniformly; the child with the higher value is the chosen one.

Random draws are counter-based (see `tree_arrays.random_keys`): a pure function of the run seed,
the node keys and the agent index, so a rerun or resume picks the same pairs. All work is whole
array operations: candidates are laid out grouped by (agent, parent) and each uniform draw is a
segment maximum of random keys (`np.maximum.reduceat`).

Example:
    >>> import numpy as np
    >>> parent = np.array([-1, 0, 0, 0])
    >>> value = np.array([[0.0], [1.0], [0.0], [0.2]])
    >>> acted = np.array([[False], [True], [True], [False]])
    >>> p = select_pairs(parent, value, acted, method="positive_negative", threshold=[0.5],
    ...                  reward_min=[0.0], reward_max=[1.0], interval_threshold_proportion=0.1,
    ...                  node_key=np.arange(4), seed=0)
    >>> (p.parent.tolist(), p.chosen.tolist(), p.rejected.tolist())
    ([0], [1], [2])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from nip_core.tree_arrays import (
    as_agent_vector,
    as_node_keys,
    as_node_matrix,
    as_parent_array,
    mix64,
    random_keys,
    seed_base,
    segment_starts,
    tag_with_position,
)

PairMethod = Literal["positive_negative", "interval"]
PAIR_METHODS: tuple[str, ...] = ("positive_negative", "interval")

__all__ = ["PAIR_METHODS", "PairMethod", "Pairs", "is_positive", "select_pairs"]


@dataclass(frozen=True, eq=False)
class Pairs:
    """Selected pairs as parallel int64 arrays of node indices, sorted by (agent, parent)."""

    agent: np.ndarray
    parent: np.ndarray
    chosen: np.ndarray
    rejected: np.ndarray

    def __len__(self) -> int:
        return int(self.agent.size)


@dataclass(frozen=True, eq=False)
class _Candidates:
    """(agent, child) entries in which the agent acted, grouped by (agent, parent)."""

    agent: np.ndarray  # int64[E]
    node: np.ndarray  # int64[E]
    parent: np.ndarray  # int64[E]
    value: np.ndarray  # float64[E], the agent's value of the child
    starts: np.ndarray  # int64[G], first entry of each (agent, parent) group


def is_positive(value: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """bool[N, A]: value >= the agent's threshold (a tie at the threshold is positive)."""
    value = np.asarray(value, dtype=np.float64)
    if value.ndim != 2:
        raise ValueError(f"value must have shape [N, A], got {value.shape}")
    return value >= as_agent_vector(threshold, value.shape[1], "threshold")[None, :]


def select_pairs(
    parent: np.ndarray,
    value: np.ndarray,
    acted: np.ndarray,
    *,
    method: PairMethod,
    threshold: np.ndarray,
    reward_min: np.ndarray,
    reward_max: np.ndarray,
    interval_threshold_proportion: float,
    node_key: np.ndarray,
    seed: int,
) -> Pairs:
    """Pick at most one (chosen, rejected) sibling pair per (parent, agent).

    Args:
        parent: int64[N], parent index of each node (-1 for roots); parents precede children.
        value: float64[N, A], each node's expected reward per agent.
        acted: bool[N, A], whether the agent wrote a message (or decided) at the node.
        method: `"positive_negative"` or `"interval"` (see the module docstring).
        threshold: float64[A], the reward mid-point per agent (`positive_negative`).
        reward_min, reward_max: float64[A], each agent's reward range (`interval`).
        interval_threshold_proportion: minimum gap as a share of the range (`interval`), >= 0.
        node_key: uint64[N], a stable integer per node, the source of all randomness.
        seed: run seed, a non-negative int below 2**64.

    Returns:
        `Pairs` sorted by (agent, parent): exactly one pair for every (parent, agent) that
        admits one, none for the others.
    """
    if method not in PAIR_METHODS:
        raise ValueError(f"unknown pair method {method!r}; expected one of {PAIR_METHODS}")
    parent = as_parent_array(parent)
    n = parent.size
    value = as_node_matrix(value, n, "value", np.float64)
    acted = as_node_matrix(acted, n, "acted", np.bool_)
    if acted.shape != value.shape:
        raise ValueError(f"acted has shape {acted.shape} but value has {value.shape}")
    n_agents = value.shape[1]
    keys = as_node_keys(node_key, n)
    thr = as_agent_vector(threshold, n_agents, "threshold")
    gap = _min_gaps(reward_min, reward_max, interval_threshold_proportion, n_agents)
    seed_base(seed)  # validate even when no draw is needed
    cand = _candidates(parent, value, acted)
    if method == "positive_negative":
        return _positive_negative(cand, thr, keys, seed)
    return _interval(cand, gap, keys, seed)


def _candidates(parent: np.ndarray, value: np.ndarray, acted: np.ndarray) -> _Candidates:
    """Lay out (agent, child) entries agent-major, then by parent, then by child index."""
    child = np.flatnonzero(parent >= 0)
    child_parent = parent[child]
    if np.any(child_parent[1:] < child_parent[:-1]):  # not BFS-like: group siblings once
        order = np.argsort(child_parent, kind="stable")
        child, child_parent = child[order], child_parent[order]
    agent, pos = np.nonzero(acted[child].T)  # row-major over (agent, child): agent-major
    node = child[pos]
    par = child_parent[pos]
    return _Candidates(
        agent=agent.astype(np.int64, copy=False),
        node=node,
        parent=par,
        value=value[node, agent],
        starts=segment_starts(agent, par),
    )


def _positive_negative(
    cand: _Candidates, threshold: np.ndarray, node_key: np.ndarray, seed: int
) -> Pairs:
    """One uniform positive and one uniform negative candidate per group that has both."""
    if cand.node.size == 0:
        return _empty_pairs()
    tagged, low = tag_with_position(random_keys(seed, node_key[cand.node], cand.agent))
    positive = cand.value >= threshold[cand.agent]
    best_pos = np.maximum.reduceat(np.where(positive, tagged, 0), cand.starts)
    best_neg = np.maximum.reduceat(np.where(positive, 0, tagged), cand.starts)
    ok = (best_pos > 0) & (best_neg > 0)
    chosen = (best_pos[ok] & low).astype(np.int64) - 1
    rejected = (best_neg[ok] & low).astype(np.int64) - 1
    first = cand.starts[ok]
    return Pairs(cand.agent[first], cand.parent[first], cand.node[chosen], cand.node[rejected])


def _interval(cand: _Candidates, min_gap: np.ndarray, node_key: np.ndarray, seed: int) -> Pairs:
    """One uniform pair per group among sibling pairs whose value gap exceeds `min_gap`."""
    first, second = _within_group_pairs(cand.starts, cand.node.size)
    gap = np.abs(cand.value[first] - cand.value[second])
    keep = gap > min_gap[cand.agent[first]]
    first, second = first[keep], second[keep]
    if first.size == 0:
        return _empty_pairs()
    # Symmetric pair key: the draw does not depend on which sibling comes first.
    entry_key = random_keys(seed, node_key[cand.node], cand.agent, extra=1)
    with np.errstate(over="ignore"):
        pair_key = mix64(entry_key[first] + entry_key[second])
    tagged, low = tag_with_position(pair_key)
    group = np.searchsorted(cand.starts, first, side="right") - 1
    pair_starts = segment_starts(group)
    pick = (np.maximum.reduceat(tagged, pair_starts) & low).astype(np.int64) - 1
    i, j = first[pick], second[pick]
    i_wins = cand.value[i] > cand.value[j]  # never equal: the gap is strictly positive
    return Pairs(
        cand.agent[i],
        cand.parent[i],
        np.where(i_wins, cand.node[i], cand.node[j]),
        np.where(i_wins, cand.node[j], cand.node[i]),
    )


def _within_group_pairs(starts: np.ndarray, n_entries: int) -> tuple[np.ndarray, np.ndarray]:
    """All (i, j) entry pairs with i < j inside the same group, in group order."""
    sizes = np.diff(np.append(starts, n_entries))
    group_start = np.repeat(starts, sizes)
    group_end = group_start + np.repeat(sizes, sizes)
    entry = np.arange(n_entries)
    partners = group_end - entry - 1  # entries after `entry` in its group
    first = np.repeat(entry, partners)
    run_start = np.cumsum(partners) - partners
    second = first + 1 + (np.arange(first.size) - np.repeat(run_start, partners))
    return first, second


def _min_gaps(
    reward_min: np.ndarray, reward_max: np.ndarray, proportion: float, n_agents: int
) -> np.ndarray:
    """Per-agent minimum value gap for the `interval` method, after checking the inputs."""
    lo = as_agent_vector(reward_min, n_agents, "reward_min")
    hi = as_agent_vector(reward_max, n_agents, "reward_max")
    if np.any(hi < lo):
        raise ValueError(f"reward_max must be >= reward_min for every agent, got {hi} < {lo}")
    if not np.isfinite(proportion) or proportion < 0:
        raise ValueError(
            f"interval_threshold_proportion must be a finite number >= 0, got {proportion}"
        )
    return proportion * (hi - lo)


def _empty_pairs() -> Pairs:
    """A `Pairs` with no rows."""
    empty = np.zeros(0, dtype=np.int64)
    return Pairs(empty, empty, empty, empty)
