"""Which datapoints an iteration uses.

One permutation of the train split, seeded by the run seed, is read in consecutive windows of
`rollouts_per_iteration`: iteration i takes positions [i*n, (i+1)*n), wrapping around the end.
Unlike the reference's fast-forwarding loader this never hangs once i*n exceeds the dataset size
(nip_behaviour §8.7), and every position gets a unique `batch_index` so node ids never collide.
"""

from __future__ import annotations

import numpy as np

from nip_core.seeding import stable_int


def dataset_permutation(num_datapoints: int, run_seed: int) -> np.ndarray:
    if num_datapoints <= 0:
        raise ValueError("the training split is empty")
    rng = np.random.default_rng(stable_int("dataset-permutation", run_seed))
    return rng.permutation(num_datapoints)


def iteration_positions(
    num_datapoints: int, run_seed: int, iteration: int, rollouts_per_iteration: int
) -> tuple[np.ndarray, np.ndarray]:
    """(batch indices, dataset row positions) of the iteration's datapoints."""
    if rollouts_per_iteration <= 0:
        raise ValueError("rl.rollouts_per_iteration must be positive")
    permutation = dataset_permutation(num_datapoints, run_seed)
    batch_indices = np.arange(
        iteration * rollouts_per_iteration, (iteration + 1) * rollouts_per_iteration
    )
    return batch_indices, permutation[batch_indices % num_datapoints]


def in_shards(items: list, size: int) -> list[list]:
    """`items` in consecutive shards of `size` (the last may be shorter)."""
    return [items[i : i + size] for i in range(0, len(items), size)]
