"""Iteration batches: one seeded permutation, consecutive windows, wrapping without hanging."""

import numpy as np
import pytest

from nip_core.malt.batching import iteration_positions


def test_windows_cover_the_permutation_then_wrap():
    seen = []
    for iteration in range(5):
        batch, positions = iteration_positions(
            10, run_seed=1, iteration=iteration, rollouts_per_iteration=4
        )
        assert list(batch) == list(range(4 * iteration, 4 * iteration + 4))
        seen.extend(positions)
    assert sorted(seen[:10]) == list(range(10))
    assert seen[10:20] == seen[:10]  # the same permutation again after wrapping


def test_far_iterations_do_not_hang_and_batch_larger_than_data():
    batch, positions = iteration_positions(
        3, run_seed=5, iteration=10_000, rollouts_per_iteration=7
    )
    assert len(positions) == 7 and set(positions) <= {0, 1, 2}
    assert len(set(batch)) == 7


def test_seed_changes_permutation_and_errors():
    a = iteration_positions(50, 1, 0, 50)[1]
    b = iteration_positions(50, 2, 0, 50)[1]
    assert not np.array_equal(a, b)
    with pytest.raises(ValueError, match="empty"):
        iteration_positions(0, 1, 0, 4)
    with pytest.raises(ValueError, match="positive"):
        iteration_positions(5, 1, 0, 0)
