"""Shared helpers for forests stored as flat numpy arrays.

A forest of rollout trees is a `parent: int64[N]` array (-1 for roots) in topological order
(every parent index is smaller than its children's), plus a `depth: int32[N]` array. Per-node,
per-agent quantities are `[N, A]` arrays. The estimators in `expected_reward` and the pair
selection in `preference_pairs` loop over tree *levels*, never over nodes, so everything here
works on whole arrays.

Randomness is counter-based: a random key is a pure function of (run seed, node key, agent
index, extra), computed with the splitmix64 finaliser, so results never depend on call order,
global RNG state or Python's salted `hash`.
"""

from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def as_parent_array(parent: np.ndarray) -> np.ndarray:
    """Return `parent` as int64 after checking it describes a forest in topological order."""
    parent = np.asarray(parent)
    if parent.ndim != 1:
        raise ValueError(f"parent must be a 1-D array, got shape {parent.shape}")
    if parent.size and not np.issubdtype(parent.dtype, np.integer):
        raise ValueError(f"parent must hold integers, got dtype {parent.dtype}")
    parent = parent.astype(np.int64, copy=False)
    if parent.size == 0:
        return parent
    if parent.min() < -1:
        raise ValueError("parent holds a value below -1 (only -1 marks a root)")
    bad = np.flatnonzero(parent >= np.arange(parent.size))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"parent is not in topological order: node {i} has parent {int(parent[i])} "
            "(every parent index must be smaller than its child's)"
        )
    return parent


def check_depth(parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Return `depth` as int64 after checking roots are 0 and children are parent + 1."""
    depth = np.asarray(depth)
    if depth.shape != parent.shape:
        raise ValueError(f"depth has shape {depth.shape}, expected {parent.shape} like parent")
    if depth.size and not np.issubdtype(depth.dtype, np.integer):
        raise ValueError(f"depth must hold integers, got dtype {depth.dtype}")
    depth = depth.astype(np.int64, copy=False)
    is_root = parent < 0
    expected = np.where(is_root, 0, depth[np.where(is_root, 0, parent)] + 1)
    bad = np.flatnonzero(depth != expected)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"depth is inconsistent at node {i}: got {int(depth[i])}, expected {int(expected[i])} "
            "(roots have depth 0, children their parent's depth + 1)"
        )
    return depth


def as_node_matrix(x: np.ndarray, n: int, name: str, dtype: type) -> np.ndarray:
    """Return a per-node, per-agent `[n, A]` array of `dtype`, or raise naming `name`."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] != n:
        raise ValueError(f"{name} must have shape [N={n}, A], got {x.shape}")
    if dtype is np.bool_ and x.dtype != np.bool_:
        raise ValueError(f"{name} must be a boolean array, got dtype {x.dtype}")
    if dtype is np.float64 and not (
        np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)
    ):
        raise ValueError(f"{name} must be numeric, got dtype {x.dtype}")
    x = x.astype(dtype, copy=False)
    if dtype is np.float64 and not np.all(np.isfinite(x)):
        raise ValueError(f"{name} holds NaN or infinite values")
    return x


def as_agent_vector(x: np.ndarray, n_agents: int, name: str) -> np.ndarray:
    """Return a finite float64 `[A]` vector (one value per agent), or raise naming `name`."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape != (n_agents,):
        raise ValueError(f"{name} must have shape [A={n_agents}], got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} holds NaN or infinite values")
    return x


# --------------------------------------------------------------------------------------------
# Structure
# --------------------------------------------------------------------------------------------


def children_counts(parent: np.ndarray, n: int) -> np.ndarray:
    """Number of children of each of the `n` nodes, as int64[n] (one `bincount`)."""
    parent = np.asarray(parent, dtype=np.int64)
    return np.bincount(parent[parent >= 0], minlength=n).astype(np.int64, copy=False)


def level_nodes(depth: np.ndarray) -> list[slice | np.ndarray]:
    """Nodes of each depth, shallowest first.

    When `depth` is non-decreasing (BFS order, the common case) each level is a contiguous
    `slice`, which makes per-level reads views instead of gathers. Otherwise one stable argsort
    groups the nodes and each level is an index array (ascending node order within a level).
    """
    if depth.size == 0:
        return []
    n_levels = int(depth.max()) + 1
    if np.all(depth[1:] >= depth[:-1]):
        bounds = np.searchsorted(depth, np.arange(n_levels + 1))
        return [slice(int(bounds[d]), int(bounds[d + 1])) for d in range(n_levels)]
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(n_levels + 1))
    return [order[bounds[d] : bounds[d + 1]] for d in range(n_levels)]


def level_slots(levels: list[slice | np.ndarray], n: int) -> np.ndarray | None:
    """Position of each node within its own level, or None when every level is a slice.

    With slices a node's slot is simply `node - level.start`, so no array is needed.
    """
    if all(isinstance(lv, slice) for lv in levels):
        return None
    slots = np.empty(n, dtype=np.int64)
    for lv in levels:
        slots[lv] = np.arange(level_size(lv))
    return slots


def level_size(level: slice | np.ndarray) -> int:
    """Number of nodes in one entry of `level_nodes`."""
    return level.stop - level.start if isinstance(level, slice) else int(level.size)


def parent_slots(
    parent: np.ndarray,
    child_level: slice | np.ndarray,
    parent_level: slice | np.ndarray,
    slots: np.ndarray | None,
) -> np.ndarray:
    """Positions, within the parent level, of the parents of `child_level`'s nodes."""
    par = parent[child_level]
    if slots is None:
        return par - parent_level.start  # type: ignore[union-attr]
    return slots[par]


def sum_into_parents(child_rows: np.ndarray, slot: np.ndarray, n_parents: int) -> np.ndarray:
    """Sum `[n_children, A]` rows into `[n_parents, A]` by parent slot with one `bincount`."""
    n_agents = child_rows.shape[1]
    flat = (slot[:, None] * n_agents + np.arange(n_agents)).ravel()
    sums = np.bincount(flat, weights=child_rows.ravel(), minlength=n_parents * n_agents)
    return sums.reshape(n_parents, n_agents)


def segment_starts(*keys: np.ndarray) -> np.ndarray:
    """Start positions of runs of equal consecutive key tuples (keys must be pre-grouped)."""
    n = keys[0].size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for k in keys:
        change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change)


# --------------------------------------------------------------------------------------------
# Counter-based randomness
# --------------------------------------------------------------------------------------------


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array, in place; returns `x`.

    A bijection on 64-bit integers with good avalanche, so distinct inputs give distinct,
    well-scrambled outputs.
    """
    tmp = np.empty_like(x)
    np.right_shift(x, np.uint64(30), out=tmp)
    x ^= tmp
    x *= _MIX1
    np.right_shift(x, np.uint64(27), out=tmp)
    x ^= tmp
    x *= _MIX2
    np.right_shift(x, np.uint64(31), out=tmp)
    x ^= tmp
    return x


def seed_base(seed: int) -> np.uint64:
    """Scramble a run seed (a non-negative int below 2**64) into a uint64 base."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ValueError(f"seed must be an int, got {type(seed).__name__}")
    if not 0 <= int(seed) <= _MASK64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return mix64(np.array([int(seed)], dtype=np.uint64))[0]


def random_keys(
    seed: int, node_key: np.ndarray, agent: np.ndarray | int, extra: int = 0
) -> np.ndarray:
    """Uniform random uint64 keys as a pure function of (seed, node key, agent, extra).

    For a fixed (seed, agent, extra) the map from node key to random key is a bijection, so
    distinct nodes never collide.
    """
    base = seed_base(seed)
    salt = mix64(np.array([(int(extra) + 1) & _MASK64], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):  # wrap-around is intended (modular hashing)
        x = np.atleast_1d(np.asarray(node_key, dtype=np.uint64) ^ (base ^ salt))
        x = x + (np.atleast_1d(np.asarray(agent, dtype=np.uint64)) + np.uint64(1)) * _GOLDEN
    return mix64(x.astype(np.uint64, copy=False))


def uniform_floats(
    seed: int, node_key: np.ndarray, agent: np.ndarray | int, extra: int = 0
) -> np.ndarray:
    """Uniform floats in [0, 1) from the top 53 bits of `random_keys`."""
    keys = random_keys(seed, node_key, agent, extra)
    return (keys >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def as_node_keys(node_key: np.ndarray, n: int) -> np.ndarray:
    """Return `node_key` as uint64[n], or raise if the shape or dtype is wrong."""
    node_key = np.asarray(node_key)
    if node_key.shape != (n,):
        raise ValueError(f"node_key must have shape [N={n}], got {node_key.shape}")
    if node_key.size and not np.issubdtype(node_key.dtype, np.integer):
        raise ValueError(f"node_key must hold integers, got dtype {node_key.dtype}")
    return node_key.astype(np.uint64, copy=False)


def tag_with_position(keys: np.ndarray) -> tuple[np.ndarray, np.uint64]:
    """Replace the low bits of each key with its position + 1 (so every tag is > 0).

    The max over a segment of tagged keys then identifies a unique, uniformly random element:
    the high bits decide, the low bits break (astronomically rare) ties and tell us where it is.
    Returns the tagged keys and the low-bit mask.
    """
    n_bits = max(1, int(keys.size + 1).bit_length())
    low = np.uint64((1 << n_bits) - 1)
    tagged = keys & ~low
    tagged |= np.arange(1, keys.size + 1, dtype=np.uint64)
    return tagged, low
