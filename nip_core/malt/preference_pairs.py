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

Random draws are counter-based (`tree_arrays.node_hashes`): a pure function of the run seed, the
node keys and the agent index (an interval pair's draw is symmetric in its two siblings), so a
rerun or resume picks the same pairs however the forest is stored. A uniform pick is the
candidate with the largest random key. All work is whole-array operations: siblings are grouped
by parent and bucketed by family size (`tree_arrays.sibling_buckets`), so the only Python loops
run over agents and distinct family sizes. The `interval` method enumerates all sibling pairs,
which is meant for MALT's small families (K = 2..4 children), not for thousands of siblings.

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

from nip_core.malt.tree_arrays import (
    Bucket,
    as_agent_vector,
    as_node_keys,
    as_node_matrix,
    as_parent_array,
    column_argmax,
    mix64,
    node_hashes,
    non_roots,
    random_draws,
    seed_base,
    sibling_buckets,
)

PairMethod = Literal["positive_negative", "interval"]
PAIR_METHODS: tuple[str, ...] = ("positive_negative", "interval")
PairsPerParent = Literal["one", "all"]
PAIRS_PER_PARENT: tuple[str, ...] = ("one", "all")

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


def is_positive(value: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """bool[N, A]: value >= the agent's threshold (a tie at the threshold is positive)."""
    value = np.asarray(value, dtype=np.float64)
    if value.ndim != 2:
        raise ValueError(f"value must have shape [N, A], got {value.shape}")
    return value >= as_agent_vector(threshold, value.shape[1], "threshold")[None, :]


def _check_choices(method: str, pairs_per_parent: str) -> None:
    if method not in PAIR_METHODS:
        raise ValueError(f"unknown pair method {method!r}; expected one of {PAIR_METHODS}")
    if pairs_per_parent not in PAIRS_PER_PARENT:
        raise ValueError(
            f"pairs_per_parent must be one of {PAIRS_PER_PARENT}, got {pairs_per_parent!r}"
        )


def _family_inputs(
    parent, value, acted, node_key, threshold, reward_min, reward_max, proportion
) -> tuple[_Family, np.ndarray, np.ndarray]:
    """Checked inputs as (sibling families, per-agent mid-points, per-agent minimum gaps)."""
    n = parent.size
    value = as_node_matrix(value, n, "value", np.float64)
    acted = as_node_matrix(acted, n, "acted", np.bool_)
    if acted.shape != value.shape:
        raise ValueError(f"acted has shape {acted.shape} but value has {value.shape}")
    n_agents = value.shape[1]
    keys = as_node_keys(node_key, n)
    thr = as_agent_vector(threshold, n_agents, "threshold")
    gap = _min_gaps(reward_min, reward_max, proportion, n_agents)
    nodes, buckets = sibling_buckets(parent, non_roots(parent), min_size=2)
    family = _Family(
        nodes=nodes,
        buckets=buckets,
        value=_agent_rows(value, nodes),
        acted=_agent_rows(acted, nodes),
        key=keys[nodes],
    )
    return family, thr, gap


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
    pairs_per_parent: PairsPerParent = "one",
) -> Pairs:
    """Pick at most one (chosen, rejected) sibling pair per (parent, agent), or every one.

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
        pairs_per_parent: `"one"` (nip: one uniform draw among the admissible pairs) or
            `"all"`: every unordered sibling pair the method admits, each once (for
            `positive_negative`, every (positive, negative) combination).

    Returns:
        `Pairs` sorted by (agent, parent): exactly one pair for every (parent, agent) that
        admits one (`"one"`), or all of them in sibling order (`"all"`), none for the others.
    """
    _check_choices(method, pairs_per_parent)
    parent = as_parent_array(parent)
    family, thr, gap = _family_inputs(
        parent, value, acted, node_key, threshold, reward_min, reward_max,
        interval_threshold_proportion,
    )  # fmt: skip
    seed_base(seed)  # validate even when no draw is needed
    if pairs_per_parent == "all":
        return _every_pair(family, method, thr, gap)
    if method == "positive_negative":
        return _positive_negative(family, thr, seed)
    return _interval(family, gap, seed)


@dataclass(frozen=True, eq=False)
class _Family:
    """Non-root nodes grouped by parent, with their per-agent data in the same order."""

    nodes: slice | np.ndarray  # grouped order -> node index
    buckets: list[Bucket]  # sibling groups of >= 2 members, by size
    value: list[np.ndarray]  # per agent, float64[M]
    acted: list[np.ndarray]  # per agent, bool[M]
    key: np.ndarray  # uint64[M]

    def node(self, position: np.ndarray) -> np.ndarray:
        """Node index of positions in the grouped order (may reuse `position`'s memory)."""
        if isinstance(self.nodes, slice):
            position += self.nodes.start
            return position
        return self.nodes[position]


def _agent_rows(matrix: np.ndarray, nodes: slice | np.ndarray) -> list[np.ndarray]:
    """Each agent's column of `matrix[nodes]` as a contiguous array (a view when it already is)."""
    return [np.ascontiguousarray(matrix[nodes, agent]) for agent in range(matrix.shape[1])]


def _positive_negative(family: _Family, threshold: np.ndarray, seed: int) -> Pairs:
    """One uniform positive and one uniform negative candidate per group that has both."""
    hashes = node_hashes(seed, family.key, extra=0)
    parts = []
    for agent in range(threshold.size):
        draw = random_draws(hashes, agent)  # > 0: zero marks "not a candidate"
        positive = family.value[agent] >= threshold[agent]
        acted = family.acted[agent]
        pos_key = draw * (acted & positive)
        neg_key = draw * (acted & ~positive)
        for bucket in family.buckets:
            pos_at, pos_best = column_argmax(bucket.rows(pos_key))
            neg_at, neg_best = column_argmax(bucket.rows(neg_key))
            rows = np.flatnonzero(np.logical_and(pos_best, neg_best))  # groups with both kinds
            first = bucket.first[rows]
            parts.append((agent, bucket.owner[rows], first + pos_at[rows], first + neg_at[rows]))
    return _collect(family, parts)


def _interval(family: _Family, min_gap: np.ndarray, seed: int) -> Pairs:
    """One uniform pair per group among sibling pairs whose value gap exceeds `min_gap`."""
    hashes = node_hashes(seed, family.key, extra=1)
    parts = []
    for bucket in family.buckets:
        left, right = np.triu_indices(bucket.size, k=1)
        member_hash = bucket.rows(hashes)
        with np.errstate(over="ignore"):  # symmetric in the two siblings; wrap-around intended
            pair_hash = mix64(member_hash[:, left] + member_hash[:, right])
        for agent in range(min_gap.size):
            value = bucket.rows(family.value[agent])
            acted = bucket.rows(family.acted[agent])
            gap = value[:, left] - value[:, right]
            valid = acted[:, left] & acted[:, right] & (np.abs(gap) > min_gap[agent])
            at, best = column_argmax(random_draws(pair_hash, agent) * valid)
            rows = np.flatnonzero(best != 0)
            at = at[rows]
            left_wins = gap.ravel()[rows * left.size + at] > 0  # never 0: the gap is > 0
            left_at, right_at = left.take(at), right.take(at)
            hi = np.where(left_wins, left_at, right_at)
            lo = left_at + right_at - hi
            first = bucket.first[rows]
            parts.append((agent, bucket.owner[rows], first + hi, first + lo))
    return _collect(family, parts)


def _every_pair(
    family: _Family, method: PairMethod, threshold: np.ndarray, min_gap: np.ndarray
) -> Pairs:
    """Every admissible unordered sibling pair, the higher-valued (or positive) one chosen."""
    parts = []
    for bucket in family.buckets:
        left, right = np.triu_indices(bucket.size, k=1)
        for agent in range(threshold.size):
            value = bucket.rows(family.value[agent])
            acted = bucket.rows(family.acted[agent])
            both = acted[:, left] & acted[:, right]
            if method == "positive_negative":
                positive = value >= threshold[agent]
                valid = both & (positive[:, left] != positive[:, right])
                left_wins = positive[:, left]
            else:
                gap = value[:, left] - value[:, right]
                valid = both & (np.abs(gap) > min_gap[agent])
                left_wins = gap > 0
            rows, at = np.nonzero(valid)  # row-major: by parent, then sibling pair
            hi = np.where(left_wins[rows, at], left[at], right[at])
            lo = left[at] + right[at] - hi
            first = bucket.first[rows]
            parts.append((agent, bucket.owner[rows], first + hi, first + lo))
    return _collect(family, parts, stable=True)


def _collect(
    family: _Family,
    parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]],
    stable: bool = False,
) -> Pairs:
    """Concatenate per-(agent, bucket) picks into `Pairs` sorted by (agent, parent)
    (`stable`: always sort, keeping the order of a parent's several pairs)."""
    if not parts:
        return _empty_pairs()
    agent = np.concatenate([np.full(p[1].size, p[0], dtype=np.int64) for p in parts])
    parent, chosen, rejected = (np.concatenate([p[k] for p in parts]) for k in (1, 2, 3))
    if stable or len(family.buckets) > 1:  # buckets interleave parents: restore the order
        order = np.lexsort((parent, agent))
        agent, parent, chosen, rejected = (
            agent[order],
            parent[order],
            chosen[order],
            rejected[order],
        )
    return Pairs(agent, parent, family.node(chosen), family.node(rejected))


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
