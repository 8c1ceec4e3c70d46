"""`pairs_per_parent="all"`: every admissible sibling pair, each once, on hand-drawn trees."""

from __future__ import annotations

import numpy as np
import pytest

from nip_core.malt.preference_pairs import select_pairs

# root 0 with four children (values 1, 0, 1, 0.2) and root 5 whose child 6 has children 7, 8.
PARENT = np.array([-1, 0, 0, 0, 0, -1, 5, 6, 6])
VALUE = np.array([[0.0], [1.0], [0.0], [1.0], [0.2], [0.0], [0.5], [1.0], [0.0]])
ACTED = np.ones((9, 1), dtype=bool)


def pairs(method: str, acted=ACTED, per_parent: str = "all"):
    p = select_pairs(
        PARENT,
        VALUE,
        acted,
        method=method,
        threshold=[0.5],
        reward_min=[0.0],
        reward_max=[1.0],
        interval_threshold_proportion=0.1,
        node_key=np.arange(9),
        seed=3,
        pairs_per_parent=per_parent,
    )
    return list(zip(p.parent.tolist(), p.chosen.tolist(), p.rejected.tolist(), strict=True))


def test_positive_negative_all_takes_every_positive_negative_combination():
    # positives 1, 3 and negatives 2, 4 under root 0; 7 positive, 8 negative under 6
    assert pairs("positive_negative") == [(0, 1, 2), (0, 1, 4), (0, 3, 2), (0, 3, 4), (6, 7, 8)]


def test_interval_all_takes_every_pair_with_a_large_enough_gap_higher_value_chosen():
    # (1, 3) has no gap; every other pair under root 0 differs by more than 0.1
    assert pairs("interval") == [
        (0, 1, 2),
        (0, 1, 4),
        (0, 3, 2),
        (0, 4, 2),
        (0, 3, 4),
        (6, 7, 8),
    ]


def test_all_respects_which_agents_acted():
    acted = ACTED.copy()
    acted[4, 0] = False
    assert pairs("positive_negative", acted) == [(0, 1, 2), (0, 3, 2), (6, 7, 8)]


def test_one_is_a_subset_of_all_with_one_pair_per_parent():
    for method in ("positive_negative", "interval"):
        one, every = pairs(method, per_parent="one"), pairs(method)
        assert set(one) <= set(every)
        assert sorted(p[0] for p in one) == [0, 6]


def test_unknown_pairs_per_parent_is_rejected():
    with pytest.raises(ValueError, match="pairs_per_parent"):
        pairs("interval", per_parent="some")
