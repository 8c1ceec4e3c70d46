"""Benchmark: vectorised expected rewards + preference pairs vs the recursive pure-Python reference.

Builds a balanced forest (default 10,000 trees, branching 2, depth 6 -> 1.27 M nodes, 2 agents),
times `expected_rewards` + `select_pairs` for both pair methods (best of several repeats), then
the recursive reference in tests/tree_reference.py (on a subset, extrapolated, when the full run
would take longer than 20 s). Run by hand from the repository root:

    python bench/tree_rewards.py [--trees 10000] [--branching 2] [--depth 6]

The last line is `ratio vectorised/recursive: <x>` with both implementations' nodes/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nip_core.malt.expected_reward import expected_rewards  # noqa: E402
from nip_core.malt.preference_pairs import select_pairs  # noqa: E402
from tests import tree_reference as ref  # noqa: E402

METHODS = ("positive_negative", "interval")
SETTINGS = {
    "threshold": np.array([0.5, 0.0]),  # prover, verifier
    "reward_min": np.array([0.0, -1.0]),
    "reward_max": np.array([1.0, 1.0]),
    "interval_threshold_proportion": 0.1,
}
RECURSIVE_BUDGET_S = 20.0


def build_forest(trees: int, branching: int, depth: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Balanced forest with terminal rewards at the leaves and 80% of (node, agent) acted."""
    parent, level = ref.balanced_forest(trees, branching, depth)
    rng = np.random.default_rng(seed)
    n = parent.size
    leaf = (level == depth)[:, None]
    prover = rng.integers(0, 2, size=n).astype(np.float64)
    verifier = rng.choice([-1.0, 1.0], size=n)
    return {
        "parent": parent,
        "depth": level,
        "step_reward": np.where(leaf, np.stack([prover, verifier], axis=1), 0.0),
        "acted": rng.random((n, 2)) < 0.8,
        "node_key": rng.integers(0, 2**63, size=n).astype(np.uint64),
    }


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """Smallest wall time of `repeats` calls (the least disturbed by other processes)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def vectorised(forest: dict[str, np.ndarray], method: str) -> int:
    """Values then pairs with the library; returns the number of pairs."""
    value = expected_rewards(forest["parent"], forest["depth"], forest["step_reward"])
    pairs = select_pairs(
        forest["parent"],
        value,
        forest["acted"],
        method=method,
        node_key=forest["node_key"],
        seed=1,
        **SETTINGS,
    )
    return len(pairs)


def recursive(lists: dict[str, list], method: str) -> int:
    """Values then pairs with the recursive reference; returns the number of pairs."""
    value = ref.monte_carlo_values(lists["parent"], lists["step_reward"])
    options = ref.valid_pairs(
        lists["parent"],
        value,
        lists["acted"],
        method=method,
        threshold=SETTINGS["threshold"].tolist(),
        reward_min=SETTINGS["reward_min"].tolist(),
        reward_max=SETTINGS["reward_max"].tolist(),
        proportion=SETTINGS["interval_threshold_proportion"],
    )
    return len(ref.sample_pairs(options, method, seed=1))


def as_lists(forest: dict[str, np.ndarray]) -> dict[str, list]:
    """Plain Python lists for the reference (conversion is not timed)."""
    return {k: forest[k].tolist() for k in ("parent", "step_reward", "acted")}


def time_recursive(args: argparse.Namespace, n_full: int) -> dict[str, tuple[float, bool]]:
    """Seconds per method for the full forest; True where extrapolated from a subset."""
    subset_trees = max(1, args.trees // 20)
    sub = build_forest(subset_trees, args.branching, args.depth)
    scale = n_full / sub["parent"].size
    sub_lists = as_lists(sub)
    full_lists = None
    out = {}
    for method in METHODS:
        sub_s = best_time(lambda m=method: recursive(sub_lists, m), 1)
        if sub_s * scale <= RECURSIVE_BUDGET_S:
            if full_lists is None:
                full_lists = as_lists(build_forest(args.trees, args.branching, args.depth))
            out[method] = (best_time(lambda m=method, ls=full_lists: recursive(ls, m), 1), False)
        else:
            out[method] = (sub_s * scale, True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", type=int, default=10_000)
    parser.add_argument("--branching", type=int, default=2)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    forest = build_forest(args.trees, args.branching, args.depth)
    n = forest["parent"].size
    print(f"forest: {args.trees} trees, branching {args.branching}, depth {args.depth}: {n} nodes")

    parent, depth, reward = forest["parent"], forest["depth"], forest["step_reward"]
    for method in ("monte_carlo", "leaf_average"):
        secs = best_time(lambda m=method: expected_rewards(parent, depth, reward, m), args.repeats)
        print(f"vectorised values ({method}): {secs * 1e3:.1f} ms")

    vec = {}
    for method in METHODS:
        n_pairs = vectorised(forest, method)
        vec[method] = best_time(lambda m=method: vectorised(forest, m), args.repeats)
        print(
            f"vectorised values + pairs ({method}): {vec[method] * 1e3:.1f} ms, {n_pairs} pairs, "
            f"{n / vec[method] / 1e6:.1f} M nodes/s"
        )

    rec = time_recursive(args, n)
    for method, (secs, extrapolated) in rec.items():
        note = " (extrapolated from a 1/20 subset: full run > 20 s)" if extrapolated else ""
        print(f"recursive values + pairs ({method}): {secs:.2f} s{note}")

    for method in METHODS:
        print(f"speed-up ({method}): {rec[method][0] / vec[method]:.0f}x")
    total_vec = sum(vec.values())
    total_rec = sum(s for s, _ in rec.values())
    print(
        f"ratio vectorised/recursive: {total_rec / total_vec:.0f}x faster "
        f"(values + pairs, both methods; vectorised {n / total_vec * 2 / 1e6:.1f} M nodes/s, "
        f"recursive {n / total_rec * 2 / 1e6:.2f} M nodes/s)"
    )


if __name__ == "__main__":
    main()
