"""Straightforward recursive pure-Python reference for the tree math.

Used by the tests to check the vectorised `nip_core.malt.expected_reward` / `preference_pairs`, and by
`bench/tree_rewards.py` as the speed baseline. Written for obviousness, not speed: plain lists,
one recursive call per node, one Python loop per (parent, agent) group.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

Matrix = list[list[float]]


def children_lists(parent: Sequence[int]) -> list[list[int]]:
    """Children of every node, in node order."""
    children: list[list[int]] = [[] for _ in parent]
    for node, up in enumerate(parent):
        if up >= 0:
            children[up].append(node)
    return children


def monte_carlo_values(parent: Sequence[int], step_reward: Matrix) -> Matrix:
    """value(n) = r(n) + mean of the children's values (leaf: r(n)), recursively."""
    children = children_lists(parent)
    out: Matrix = [[] for _ in parent]

    def visit(node: int) -> list[float]:
        kids = [visit(c) for c in children[node]]
        own = step_reward[node]
        if kids:
            out[node] = [own[a] + sum(k[a] for k in kids) / len(kids) for a in range(len(own))]
        else:
            out[node] = list(own)
        return out[node]

    for root, up in enumerate(parent):
        if up < 0:
            visit(root)
    return out


def leaf_average_values(parent: Sequence[int], step_reward: Matrix) -> Matrix:
    """nip's estimator: (subtree reward total) / (number of leaves below), recursively."""
    children = children_lists(parent)
    out: Matrix = [[] for _ in parent]

    def visit(node: int) -> tuple[list[float], int]:
        total = list(step_reward[node])
        if not children[node]:
            out[node] = total
            return total, 1
        leaves = 0
        for c in children[node]:
            sub_total, sub_leaves = visit(c)
            total = [t + s for t, s in zip(total, sub_total, strict=True)]
            leaves += sub_leaves
        out[node] = [t / leaves for t in total]
        return total, leaves

    for root, up in enumerate(parent):
        if up < 0:
            visit(root)
    return out


def valid_pairs(
    parent: Sequence[int],
    value: Matrix,
    acted: list[list[bool]],
    *,
    method: str,
    threshold: Sequence[float],
    reward_min: Sequence[float],
    reward_max: Sequence[float],
    proportion: float,
) -> dict[tuple[int, int], set[tuple[int, int]]]:
    """Every admissible (chosen, rejected) pair, keyed by (agent, parent); only non-empty keys.

    A checker, not a sampler: the vectorised code must pick exactly one member of each set.
    """
    children = children_lists(parent)
    n_agents = len(threshold)
    result: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for up, kids in enumerate(children):
        for a in range(n_agents):
            cands = [c for c in kids if acted[c][a]]
            if method == "positive_negative":
                pos = [c for c in cands if value[c][a] >= threshold[a]]
                neg = [c for c in cands if value[c][a] < threshold[a]]
                options = {(p, q) for p in pos for q in neg}
            else:
                need = proportion * (reward_max[a] - reward_min[a])
                options = set()
                for i, c in enumerate(cands):
                    for d in cands[i + 1 :]:
                        if abs(value[c][a] - value[d][a]) > need:
                            hi, lo = (c, d) if value[c][a] > value[d][a] else (d, c)
                            options.add((hi, lo))
            if options:
                result[(a, up)] = options
    return result


def sample_pairs(
    options: dict[tuple[int, int], set[tuple[int, int]]], method: str, seed: int
) -> list[tuple[int, int, int, int]]:
    """A reference sampler: (agent, parent, chosen, rejected) rows sorted by (agent, parent).

    For `positive_negative`, picks a uniform positive and a uniform negative independently
    (equivalent to a uniform member of the product set); for `interval`, a uniform pair.
    """
    rng = random.Random(seed)
    rows = []
    for (a, up), pairs in sorted(options.items()):
        ordered = sorted(pairs)
        if method == "positive_negative":
            chosen = rng.choice(sorted({p for p, _ in ordered}))
            rejected = rng.choice(sorted({q for _, q in ordered}))
        else:
            chosen, rejected = rng.choice(ordered)
        rows.append((a, up, chosen, rejected))
    return rows


# --------------------------------------------------------------------------------------------
# Random forests for property tests and the benchmark
# --------------------------------------------------------------------------------------------


def random_forest(
    rng: np.random.Generator,
    *,
    n_roots: int,
    max_depth: int,
    max_branch: int,
    n_agents: int,
    discrete: bool = True,
) -> dict[str, np.ndarray]:
    """A random forest in BFS order (all roots first, then level by level).

    Each node has 0..max_branch children (0 = the branch ended early) until `max_depth`.
    Rewards are drawn from {-1, 0, 0.5, 1} when `discrete` (so ties with thresholds and between
    siblings are common), otherwise uniform in [-1, 1]; roots earn 0.
    """
    parent = [-1] * n_roots
    depth = [0] * n_roots
    frontier = list(range(n_roots))
    for d in range(1, max_depth + 1):
        branching = rng.integers(0, max_branch + 1, size=len(frontier))
        nxt = []
        for up, k in zip(frontier, branching, strict=True):
            for _ in range(int(k)):
                nxt.append(len(parent))
                parent.append(up)
                depth.append(d)
        frontier = nxt
    n = len(parent)
    if discrete:
        reward = rng.choice([-1.0, 0.0, 0.5, 1.0], size=(n, n_agents))
    else:
        reward = rng.uniform(-1.0, 1.0, size=(n, n_agents))
    reward[:n_roots] = 0.0
    return {
        "parent": np.array(parent, dtype=np.int64),
        "depth": np.array(depth, dtype=np.int32),
        "step_reward": reward,
        "acted": rng.random((n, n_agents)) < 0.7,
        "node_key": rng.integers(0, 2**63, size=n).astype(np.uint64),
    }


def dfs_permutation(parent: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
    """`perm[new] = old`: a depth-first preorder, still topological but not level-sorted.

    With `rng`, roots and siblings are visited in random order, so sibling order changes too.
    """
    children = children_lists(parent.tolist())
    order: list[int] = []
    stack = [int(r) for r in np.flatnonzero(parent < 0)[::-1]]
    if rng is not None:
        rng.shuffle(stack)
    while stack:
        node = stack.pop()
        order.append(node)
        kids = list(reversed(children[node]))
        if rng is not None:
            rng.shuffle(kids)
        stack.extend(kids)
    return np.array(order, dtype=np.int64)


def relabel(forest: dict[str, np.ndarray], perm: np.ndarray) -> dict[str, np.ndarray]:
    """Reorder every per-node array by `perm` (new -> old) and remap parent indices."""
    new_of_old = np.empty_like(perm)
    new_of_old[perm] = np.arange(perm.size)
    out = {k: v[perm] for k, v in forest.items()}
    old_parent = forest["parent"][perm]
    out["parent"] = np.where(old_parent < 0, -1, new_of_old[np.maximum(old_parent, 0)])
    return out


def balanced_forest(n_roots: int, branching: int, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """`(parent, depth)` of `n_roots` full trees in BFS order (all roots first)."""
    parent = [np.full(n_roots, -1, dtype=np.int64)]
    depth = [np.zeros(n_roots, dtype=np.int32)]
    start, width = 0, n_roots
    for d in range(1, levels + 1):
        parent.append(np.repeat(np.arange(start, start + width), branching))
        depth.append(np.full(width * branching, d, dtype=np.int32))
        start, width = start + width, width * branching
    return np.concatenate(parent), np.concatenate(depth)
