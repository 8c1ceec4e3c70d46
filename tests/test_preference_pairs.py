"""Tests for nip_core.malt.preference_pairs: hand-drawn trees, property tests against the checker in
tests/tree_reference.py, determinism and uniformity of the random draws.

Run: pytest tests/test_preference_pairs.py -q
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nip_core.malt.expected_reward import expected_rewards
from nip_core.malt.preference_pairs import Pairs, is_positive, select_pairs
from tests import tree_reference as ref


def _pairs(parent, value, acted, method="positive_negative", seed=0, node_key=None, **kw):
    value = np.array(value, dtype=float)
    n, n_agents = value.shape
    args = {
        "threshold": np.full(n_agents, 0.5),
        "reward_min": np.zeros(n_agents),
        "reward_max": np.ones(n_agents),
        "interval_threshold_proportion": 0.5,
    } | kw
    keys = np.arange(n, dtype=np.uint64) if node_key is None else node_key
    return select_pairs(
        np.array(parent), value, np.array(acted), method=method, node_key=keys, seed=seed, **args
    )


def _rows(pairs: Pairs) -> list[tuple[int, int, int, int]]:
    return list(
        zip(
            pairs.agent.tolist(),
            pairs.parent.tolist(),
            pairs.chosen.tolist(),
            pairs.rejected.tolist(),
            strict=True,
        )
    )


def test_root_is_paired_tie_is_positive_and_inactive_agent_is_skipped():
    """Root 0 with children 1, 2, 3; thresholds 0.5 (agent 0) and 0.0 (agent 1).

    node   value (a0, a1)   acted (a0, a1)
    1      (0.5,  1)        (yes, yes)     a0: 0.5 >= 0.5 -> positive (tie)
    2      (0.0, -1)        (yes, no)      a1 did not act here -> not a candidate for a1
    3      (1.0,  1)        (yes, yes)
    agent 0: positives {1, 3}, negatives {2} -> one pair at the root, rejected = 2
    agent 1: candidates {1, 3}, both positive -> no pair
    """
    value = [[0, 0], [0.5, 1], [0, -1], [1, 1]]
    acted = [[False, False], [True, True], [True, False], [True, True]]
    for seed in range(20):
        rows = _rows(_pairs([-1, 0, 0, 0], value, acted, threshold=[0.5, 0.0], seed=seed))
        assert len(rows) == 1
        agent, parent, chosen, rejected = rows[0]
        assert (agent, parent, rejected) == (0, 0, 2) and chosen in (1, 3)


def test_tie_at_threshold_beats_value_just_below():
    """Children 1 (value exactly 0.5) and 2 (0.4999): 1 is positive, 2 negative."""
    rows = _rows(_pairs([-1, 0, 0], [[0], [0.5], [0.4999]], [[False], [True], [True]]))
    assert rows == [(0, 0, 1, 2)]


def test_is_positive_counts_ties_as_positive():
    got = is_positive(np.array([[0.5, -0.1], [0.49, 0.0]]), np.array([0.5, 0.0]))
    np.testing.assert_array_equal(got, [[True, False], [False, True]])


def test_interval_gap_must_be_strictly_greater():
    """Range [0, 1], proportion 0.5 -> a pair needs |gap| > 0.5.

    children 1: 0.25, 2: 0.75, 3: 0.875 of root 0
    (1, 2): gap 0.5 == 0.5 -> no;  (1, 3): gap 0.625 -> yes;  (2, 3): 0.125 -> no
    So the only pair is chosen 3 (higher value), rejected 1; without node 3, none.
    """
    value = [[0], [0.25], [0.75], [0.875]]
    acted = [[False], [True], [True], [True]]
    assert _rows(_pairs([-1, 0, 0, 0], value, acted, "interval")) == [(0, 0, 3, 1)]
    acted[3] = [False]
    assert len(_pairs([-1, 0, 0, 0], value, acted, "interval")) == 0


def test_early_ended_branch_and_single_child_round_give_no_pair_there():
    """0 -> {1, 2}; 1 ended early (one padding child 3); 2 -> {4, 5}.

    values: 1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0, 5: 0.0 (threshold 0.5); node 3 is padding
    pairs: at root (2 over 1) and at node 2 (4 over 5); none at node 1 (one child)
    """
    parent = [-1, 0, 0, 1, 2, 2]
    value = [[0.5], [0], [1], [0], [1], [0]]
    acted = [[False], [True], [True], [False], [True], [True]]
    assert _rows(_pairs(parent, value, acted)) == [(0, 0, 2, 1), (0, 2, 4, 5)]
    assert _rows(_pairs(parent, value, acted, "interval")) == [(0, 0, 2, 1), (0, 2, 4, 5)]


def test_forest_output_is_sorted_by_agent_then_parent():
    """Roots 0 and 3 stored as 0 -> {1, 2}, 3 -> {4, 5}; both agents act everywhere.

    agent 0 prefers the first child (1.0 vs 0.0), agent 1 the second.
    expected rows: (0, 0, 1, 2), (0, 3, 4, 5), (1, 0, 2, 1), (1, 3, 5, 4)
    """
    parent = [-1, 0, 0, -1, 3, 3]
    value = [[0, 0], [1, 0], [0, 1], [0, 0], [1, 0], [0, 1]]
    acted = [[True, True]] * 6
    want = [(0, 0, 1, 2), (0, 3, 4, 5), (1, 0, 2, 1), (1, 3, 5, 4)]
    for method in ("positive_negative", "interval"):
        assert _rows(_pairs(parent, value, acted, method)) == want


def test_trees_stored_one_after_another():
    """Roots 0, 2, 5 each followed by their children: 0 -> {1}, 2 -> {3, 4}, 5 -> {6, 7}.

    values: 1: 1.0; 3: 1.0, 4: 0.0; 6: 0.0, 7: 1.0 (threshold 0.5, all acted)
    pairs: none at 0 (one child); (3 over 4) at 2; (7 over 6) at 5
    """
    parent = [-1, 0, -1, 2, 2, -1, 5, 5]
    value = [[0], [1], [0], [1], [0], [0], [0], [1]]
    acted = [[p >= 0] for p in parent]
    assert _rows(_pairs(parent, value, acted)) == [(0, 2, 3, 4), (0, 5, 7, 6)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"method": "best_of"}, "unknown pair method 'best_of'"),
        ({"threshold": [0.5, 0.5]}, r"threshold must have shape \[A=1\]"),
        ({"acted": [[1], [0], [1]]}, "acted must be a boolean array"),
        ({"value": [[0], [1]]}, r"value must have shape \[N=3, A\]"),
        ({"node_key": np.arange(2)}, r"node_key must have shape \[N=3\]"),
        ({"seed": -1}, "seed must be in"),
        ({"seed": 1.5}, "seed must be an int"),
        ({"interval_threshold_proportion": -0.1}, "interval_threshold_proportion"),
        ({"reward_max": [-1.0]}, "reward_max must be >= reward_min"),
        ({"parent": [-1, 2, 0]}, "topological order"),
    ],
)
def test_bad_input_is_named(change, message):
    args = {
        "parent": [-1, 0, 0],
        "value": [[0], [1], [0]],
        "acted": [[False], [True], [True]],
        "method": "interval",
        "threshold": [0.5],
        "reward_min": [0.0],
        "reward_max": [1.0],
        "interval_threshold_proportion": 0.1,
        "node_key": np.arange(3),
        "seed": 0,
    } | change
    args = {k: np.array(v) if isinstance(v, list) else v for k, v in args.items()}
    with pytest.raises(ValueError, match=message):
        select_pairs(args.pop("parent"), args.pop("value"), args.pop("acted"), **args)


# --------------------------------------------------------------------------------------------
# Properties on random forests
# --------------------------------------------------------------------------------------------


@st.composite
def pair_cases(draw):
    """A random forest with values, plus method settings."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    forest = ref.random_forest(
        rng,
        n_roots=draw(st.integers(1, 3)),
        max_depth=draw(st.integers(1, 5)),
        max_branch=draw(st.integers(1, 4)),
        n_agents=draw(st.integers(1, 3)),
        discrete=draw(st.booleans()),
    )
    n_agents = forest["step_reward"].shape[1]
    method = draw(st.sampled_from(["monte_carlo", "leaf_average"]))
    forest["value"] = expected_rewards(
        forest["parent"], forest["depth"], forest["step_reward"], method
    )
    settings_ = {
        "threshold": rng.choice([-0.5, 0.0, 0.5], size=n_agents),
        "reward_min": np.full(n_agents, -1.0),
        "reward_max": np.full(n_agents, 1.0),
        "interval_threshold_proportion": draw(st.sampled_from([0.0, 0.1, 0.25, 0.5])),
    }
    return forest, settings_, draw(st.integers(0, 2**64 - 1))


def _select(forest, settings_, method, seed):
    return select_pairs(
        forest["parent"],
        forest["value"],
        forest["acted"],
        method=method,
        node_key=forest["node_key"],
        seed=seed,
        **settings_,
    )


@settings(max_examples=120, deadline=None)
@given(case=pair_cases(), method=st.sampled_from(["positive_negative", "interval"]))
def test_pairs_obey_the_rule_and_cover_every_admissible_group(case, method):
    forest, settings_, seed = case
    pairs = _select(forest, settings_, method, seed)
    options = ref.valid_pairs(
        forest["parent"].tolist(),
        forest["value"].tolist(),
        forest["acted"].tolist(),
        method=method,
        threshold=settings_["threshold"].tolist(),
        reward_min=settings_["reward_min"].tolist(),
        reward_max=settings_["reward_max"].tolist(),
        proportion=settings_["interval_threshold_proportion"],
    )
    rows = _rows(pairs)
    assert [(a, p) for a, p, _, _ in rows] == sorted(options)  # one per group, sorted, no extras
    for agent, parent, chosen, rejected in rows:
        assert (chosen, rejected) in options[(agent, parent)]
        assert forest["parent"][chosen] == forest["parent"][rejected] == parent
        assert forest["value"][chosen, agent] >= forest["value"][rejected, agent]
    again = _select(forest, settings_, method, seed)
    assert _rows(again) == rows


@settings(max_examples=60, deadline=None)
@given(case=pair_cases(), method=st.sampled_from(["positive_negative", "interval"]))
def test_choices_follow_node_identity_not_storage_order(case, method):
    """Relabelling the forest depth-first, siblings shuffled (same node keys): same pairs."""
    forest, settings_, seed = case
    perm = ref.dfs_permutation(forest["parent"], np.random.default_rng(seed % 1000))
    moved = ref.relabel(forest, perm)
    original = {(a, p, c, r) for a, p, c, r in _rows(_select(forest, settings_, method, seed))}
    relabelled = _rows(_select(moved, settings_, method, seed))
    assert {(a, perm[p], perm[c], perm[r]) for a, p, c, r in relabelled} == original


@pytest.mark.parametrize("method", ["positive_negative", "interval"])
def test_big_shuffled_forest_picks_same_pairs(method):
    """Same check as above on one larger forest, where many groups have several options."""
    rng = np.random.default_rng(11)
    forest = ref.random_forest(rng, n_roots=20, max_depth=4, max_branch=4, n_agents=2)
    forest["value"] = expected_rewards(forest["parent"], forest["depth"], forest["step_reward"])
    settings_ = {
        "threshold": np.zeros(2),
        "reward_min": -np.ones(2),
        "reward_max": np.ones(2),
        "interval_threshold_proportion": 0.1,
    }
    perm = ref.dfs_permutation(forest["parent"], rng)
    moved = ref.relabel(forest, perm)
    original = _rows(_select(forest, settings_, method, 5))
    relabelled = _rows(_select(moved, settings_, method, 5))
    assert len(original) > 100
    assert {(a, perm[p], perm[c], perm[r]) for a, p, c, r in relabelled} == set(original)


def _identical_groups(n_groups: int, group_values: list[float]) -> dict[str, np.ndarray]:
    """`n_groups` roots, each with the same children values (one agent, all acted)."""
    k = len(group_values)
    parent, depth = ref.balanced_forest(n_groups, k, 1)
    value = np.concatenate([np.zeros(n_groups), np.tile(group_values, n_groups)])[:, None]
    acted = (depth > 0)[:, None]
    return {"parent": parent, "value": value, "acted": acted, "node_key": np.arange(parent.size)}


@pytest.mark.parametrize("method", ["positive_negative", "interval"])
def test_seed_changes_choices_and_same_seed_repeats(method):
    forest = _identical_groups(500, [1.0, 1.0, 0.0, 0.0])
    settings_ = {
        "threshold": np.array([0.5]),
        "reward_min": np.array([0.0]),
        "reward_max": np.array([1.0]),
        "interval_threshold_proportion": 0.5,
    }
    first = _select(forest, settings_, method, seed=1)
    assert len(first) == 500
    assert _rows(_select(forest, settings_, method, seed=1)) == _rows(first)
    other = _select(forest, settings_, method, seed=2)
    changed = (other.chosen != first.chosen) | (other.rejected != first.rejected)
    assert 100 < changed.sum() < 500  # about 3/4 of the groups should differ


def _chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


# Upper 1e-4 tail of the chi-square distribution for 1 and 2 degrees of freedom.
_CHI2_CRIT = {1: 15.14, 2: 18.42}


@pytest.mark.parametrize("seed", [0, 7])
def test_positive_negative_draws_are_uniform(seed):
    """3000 identical groups of 5 children valued [1, 1, 1, 0, 0] (threshold 0.5).

    The chosen child is uniform over the 3 positives, the rejected one over the 2 negatives.
    """
    n_groups, k = 3000, 5
    forest = _identical_groups(n_groups, [1.0, 1.0, 1.0, 0.0, 0.0])
    pairs = _select(
        forest,
        {
            "threshold": np.array([0.5]),
            "reward_min": np.array([0.0]),
            "reward_max": np.array([1.0]),
            "interval_threshold_proportion": 0.0,
        },
        "positive_negative",
        seed,
    )
    assert len(pairs) == n_groups
    position = lambda nodes: (nodes - n_groups) % k  # noqa: E731
    chosen = np.bincount(position(pairs.chosen), minlength=k)
    rejected = np.bincount(position(pairs.rejected), minlength=k)
    assert chosen[3:].sum() == 0 and rejected[:3].sum() == 0
    assert _chi_square(chosen[:3]) < _CHI2_CRIT[2]
    assert _chi_square(rejected[3:]) < _CHI2_CRIT[1]


@pytest.mark.parametrize("seed", [0, 7])
def test_interval_draws_are_uniform_over_valid_pairs(seed):
    """3000 identical groups valued [0, 1, 2, 3], range [0, 3], proportion 0.5 -> gap > 1.5.

    Valid pairs (by position): (2 over 0), (3 over 0), (3 over 1); each should get ~1/3.
    """
    n_groups, k = 3000, 4
    forest = _identical_groups(n_groups, [0.0, 1.0, 2.0, 3.0])
    pairs = _select(
        forest,
        {
            "threshold": np.array([0.5]),
            "reward_min": np.array([0.0]),
            "reward_max": np.array([3.0]),
            "interval_threshold_proportion": 0.5,
        },
        "interval",
        seed,
    )
    assert len(pairs) == n_groups
    code = ((pairs.chosen - n_groups) % k) * k + (pairs.rejected - n_groups) % k
    counts = np.bincount(code, minlength=k * k)
    valid = [2 * k + 0, 3 * k + 0, 3 * k + 1]
    assert counts.sum() == counts[valid].sum()
    assert _chi_square(counts[valid]) < _CHI2_CRIT[2]


def test_module_example_runs():
    import doctest

    from nip_core.malt import preference_pairs

    assert doctest.testmod(preference_pairs).failed == 0


def test_uniform_floats_are_deterministic_and_spread():
    """Counter-based floats: same inputs -> same floats; ~uniform over 10 bins; seed matters."""
    from nip_core.malt.tree_arrays import uniform_floats

    keys = np.arange(20_000, dtype=np.uint64)
    u = uniform_floats(3, keys, agent=1)
    np.testing.assert_array_equal(u, uniform_floats(3, keys, agent=1))
    assert u.min() >= 0.0 and u.max() < 1.0
    counts = np.bincount((u * 10).astype(int), minlength=10)
    assert _chi_square(counts) < 33.7  # 9 degrees of freedom, upper 1e-4 tail
    assert np.mean(u != uniform_floats(4, keys, agent=1)) > 0.99
    assert np.mean(u != uniform_floats(3, keys, agent=2)) > 0.99
