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

from dataclasses import dataclass

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
    """Return `depth` after checking roots are 0 and every child is its parent's depth + 1."""
    depth = np.asarray(depth)
    if depth.shape != parent.shape:
        raise ValueError(f"depth has shape {depth.shape}, expected {parent.shape} like parent")
    if depth.size and not np.issubdtype(depth.dtype, np.integer):
        raise ValueError(f"depth must hold integers, got dtype {depth.dtype}")
    child = non_roots(parent)
    bad_child = depth[child] != depth[parent[child]] + 1
    bad_root = (depth != 0) & (parent < 0)
    if bad_child.any() or bad_root.any():
        i = min(
            int(np.arange(parent.size)[child][np.argmax(bad_child)])
            if bad_child.any()
            else parent.size,
            int(np.argmax(bad_root)) if bad_root.any() else parent.size,
        )
        want = 0 if parent[i] < 0 else int(depth[parent[i]]) + 1
        raise ValueError(
            f"depth is inconsistent at node {i}: got {int(depth[i])}, expected {want} "
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


def as_node_keys(node_key: np.ndarray, n: int) -> np.ndarray:
    """Return `node_key` as uint64[n], or raise if the shape or dtype is wrong."""
    node_key = np.asarray(node_key)
    if node_key.shape != (n,):
        raise ValueError(f"node_key must have shape [N={n}], got {node_key.shape}")
    if node_key.size and not np.issubdtype(node_key.dtype, np.integer):
        raise ValueError(f"node_key must hold integers, got dtype {node_key.dtype}")
    return node_key.astype(np.uint64, copy=False)


# --------------------------------------------------------------------------------------------
# Structure: levels and sibling groups
# --------------------------------------------------------------------------------------------


def children_counts(parent: np.ndarray, n: int) -> np.ndarray:
    """Number of children of each of the `n` nodes, as int64[n] (one `bincount`)."""
    parent = np.asarray(parent, dtype=np.int64)
    return np.bincount(parent[parent >= 0], minlength=n).astype(np.int64, copy=False)


def level_nodes(depth: np.ndarray) -> list[slice | np.ndarray]:
    """Nodes of each depth, shallowest first.

    When `depth` is non-decreasing (BFS order, the common case) each level is a contiguous
    `slice`, so per-level reads are views instead of gathers. Otherwise one stable argsort
    groups the nodes and each level is an index array (ascending node order within a level).
    """
    if depth.size == 0:
        return []
    n_levels = int(depth.max()) + 1
    if np.all(depth[1:] >= depth[:-1]):
        bounds = np.searchsorted(depth, np.arange(n_levels + 1, dtype=depth.dtype))  # no cast
        return [slice(int(bounds[d]), int(bounds[d + 1])) for d in range(n_levels)]
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(n_levels + 1, dtype=depth.dtype))
    return [order[bounds[d] : bounds[d + 1]] for d in range(n_levels)]


def non_roots(parent: np.ndarray) -> slice | np.ndarray:
    """All non-root nodes: a slice when the roots are exactly the first nodes (BFS order)."""
    is_root = parent < 0
    n_roots = int(np.count_nonzero(is_root))
    if is_root[:n_roots].all():
        return slice(n_roots, parent.size)
    return np.flatnonzero(parent >= 0)


@dataclass(frozen=True, eq=False)
class Bucket:
    """The sibling groups that all have `size` members.

    Groups are runs of equal parent in the grouped node order returned by `sibling_buckets`.
    Working one group size at a time turns "reduce over each group" into a few elementwise
    operations on `[..., G, size]` arrays, which is much faster than `ufunc.reduceat` or
    `bincount` on small groups. There are at most as many buckets as distinct family sizes.
    """

    size: int
    first: np.ndarray  # int64[G]: position of each group's first member in the grouped order
    owner: np.ndarray  # int64[G]: the parent node of each group (strictly increasing)
    tiles: bool  # the groups tile the whole grouped order, so `rows` is a reshape

    def rows(self, ordered: np.ndarray) -> np.ndarray:
        """`[..., G, size]` group members from an array whose last axis is the grouped order."""
        if self.tiles:
            return ordered.reshape(*ordered.shape[:-1], self.first.size, self.size)
        return ordered[..., self.first[:, None] + np.arange(self.size)]

    @property
    def owner_index(self) -> slice | np.ndarray:
        """`owner` as a slice when the owners are consecutive nodes (BFS order), for cheap writes."""
        own = self.owner
        if own.size and int(own[-1]) - int(own[0]) + 1 == own.size:
            return slice(int(own[0]), int(own[-1]) + 1)
        return own


def sibling_buckets(
    parent: np.ndarray, nodes: slice | np.ndarray, min_size: int = 1
) -> tuple[slice | np.ndarray, list[Bucket]]:
    """Group `nodes` by parent (stable) and bucket the groups by size.

    Returns the nodes in grouped order (the input slice when already grouped, as in BFS order)
    and the buckets of groups with at least `min_size` members, smallest size first.
    """
    child_parent = parent[nodes]
    if np.any(child_parent[1:] < child_parent[:-1]):  # not BFS-like: group siblings once
        order = np.argsort(child_parent, kind="stable")
        nodes = np.arange(parent.size)[nodes][order]
        child_parent = child_parent[order]
    if child_parent.size == 0:
        return nodes, []
    change = np.empty(child_parent.size, dtype=bool)
    change[0] = True
    np.not_equal(child_parent[1:], child_parent[:-1], out=change[1:])
    starts = np.flatnonzero(change)
    sizes = np.diff(np.append(starts, child_parent.size))
    owner = child_parent[starts]
    per_size = np.bincount(sizes)
    buckets = []
    for size in np.flatnonzero(per_size):
        if size < min_size:
            continue
        if per_size[size] == starts.size:
            buckets.append(Bucket(int(size), starts, owner, tiles=True))
        else:
            pick = np.flatnonzero(sizes == size)
            buckets.append(Bucket(int(size), starts[pick], owner[pick], tiles=False))
    return nodes, buckets


def column_argmax(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(argmax, max) over the small last axis; ties go to the first column.

    A loop over the few columns of whole-array operations, several times faster than
    `argmax(axis=-1)` on the narrow matrices that sibling groups give. The index is uint8 when
    the axis is short enough (for k = 2 it is a free view of the comparison).
    """
    k = matrix.shape[-1]
    best = matrix[..., 0]
    index = np.zeros(best.shape, dtype=np.uint8 if k < 256 else np.int64)
    for j in range(1, k):
        column = matrix[..., j]
        better = column > best
        best = np.maximum(best, column)
        if j == 1 and index.dtype == np.uint8:
            index = better.view(np.uint8)
        else:
            index = np.where(better, index.dtype.type(j), index)
    return index, np.array(best, copy=True) if k == 1 else best


def column_sum(matrix: np.ndarray) -> np.ndarray:
    """Sum over the small last axis, one column at a time."""
    total = matrix[..., 0].copy()
    for j in range(1, matrix.shape[-1]):
        total += matrix[..., j]
    return total


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


def _mix_int(value: int) -> np.uint64:
    """`mix64` of one Python int (taken modulo 2**64)."""
    return mix64(np.array([value & _MASK64], dtype=np.uint64))[0]


def seed_base(seed: int) -> np.uint64:
    """Scramble a run seed (a non-negative int below 2**64) into a uint64 base."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ValueError(f"seed must be an int, got {type(seed).__name__}")
    if not 0 <= int(seed) <= _MASK64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return _mix_int(int(seed))


def node_hashes(seed: int, node_key: np.ndarray, extra: int = 0) -> np.ndarray:
    """uint64 hash of each (seed, node key, extra); a bijection of the node key.

    Distinct nodes therefore never collide, and the value depends only on the node's identity,
    not on where it is stored.
    """
    salt = seed_base(seed) ^ _mix_int(int(extra) + 1)
    return mix64(np.asarray(node_key, dtype=np.uint64) ^ salt)


def agent_bits(hashes: np.ndarray, agent: int) -> np.ndarray:
    """32 random bits (uint32) per hash for one agent.

    Agents 2k and 2k+1 take the high and low halves of word k (word 0 is the hash itself, word k
    a re-mix), so two agents cost one hash. 32 bits are plenty for a uniform pick among a few
    siblings.
    """
    if agent < 2:
        word = hashes
    else:
        with np.errstate(over="ignore"):  # modular arithmetic is intended
            word = mix64(hashes + np.uint64(agent // 2) * _GOLDEN)
    if agent % 2 == 0:
        word = word >> np.uint64(32)
    return word.astype(np.uint32)  # keeps the low 32 bits


def random_draws(hashes: np.ndarray, agent: int) -> np.ndarray:
    """Random uint32 sort keys, all odd (so > 0), for "largest key wins" picks.

    Zero is kept free to mark non-candidates. Two candidates tie with probability 2**-31 (the
    first then wins), a negligible bias.
    """
    draws = agent_bits(hashes, agent)
    draws |= np.uint32(1)
    return draws


def uniform_floats(seed: int, node_key: np.ndarray, agent: int = 0, extra: int = 0) -> np.ndarray:
    """Uniform floats in [0, 1) (32-bit resolution) per node, for other counter-based draws."""
    bits = agent_bits(node_hashes(seed, node_key, extra), agent)
    return bits.astype(np.float64) * (1.0 / (1 << 32))
