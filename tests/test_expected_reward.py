"""Tests for nip_core.malt.expected_reward: hand-drawn trees plus property tests against a recursive
pure-Python reference (tests/tree_reference.py).

Run: pytest tests/test_expected_reward.py -q
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nip_core.malt.expected_reward import expected_rewards
from nip_core.malt.tree_arrays import children_counts
from tests import tree_reference as ref


def _values(parent, depth, reward, method="monte_carlo"):
    return expected_rewards(
        np.array(parent), np.array(depth), np.array(reward, dtype=float), method=method
    )


def test_ragged_tree_estimators_differ():
    """A branch that ends early (node 1) beside one that continues (node 2).

            0           r0 = (0, 0)
          /   \\
         1     2        r1 = (1, 1) [leaf]   r2 = (0, 0)
              / \\
             3   4      r3 = (0, -1)  r4 = (1, 1)

    monte_carlo, agent 0: v2 = 0 + (0 + 1)/2 = 0.5; v0 = (v1 + v2)/2 = (1 + 0.5)/2 = 0.75
                 agent 1: v2 = (-1 + 1)/2 = 0;     v0 = (1 + 0)/2 = 0.5
    leaf_average, agent 0: v2 = (0 + 1)/2 = 0.5;   v0 = (1 + 0 + 1)/3 leaves = 2/3
                  agent 1: v2 = 0;                 v0 = (1 - 1 + 1)/3 = 1/3
    """
    parent, depth = [-1, 0, 0, 2, 2], [0, 1, 1, 2, 2]
    reward = [[0, 0], [1, 1], [0, 0], [0, -1], [1, 1]]
    mc = _values(parent, depth, reward)
    la = _values(parent, depth, reward, "leaf_average")
    np.testing.assert_allclose(mc, [[0.75, 0.5], [1, 1], [0.5, 0], [0, -1], [1, 1]])
    np.testing.assert_allclose(la, [[2 / 3, 1 / 3], [1, 1], [0.5, 0], [0, -1], [1, 1]])


def test_single_child_round_passes_value_through():
    """A frozen round has one child; with reward only at the leaves both estimators agree.

    0 -> 1 -> {2, 3}       r2 = 1, r3 = 0, others 0
    v1 = (1 + 0)/2 = 0.5; v0 = v1 = 0.5 (mean over one child; leaf_average: 1/2 leaves)
    """
    parent, depth = [-1, 0, 1, 1], [0, 1, 2, 2]
    reward = [[0], [0], [1], [0]]
    for method in ("monte_carlo", "leaf_average"):
        np.testing.assert_allclose(_values(parent, depth, reward, method)[:, 0], [0.5, 0.5, 1, 0])


def test_inner_step_reward_is_added_in_full_by_monte_carlo_only():
    """A penalty earned at an inner node (e.g. a verifier that did not guess).

    0 -> 1 (r1 = -0.5) -> {2 (r = 1), 3 (r = 0)}
    monte_carlo:  v1 = -0.5 + (1 + 0)/2 = 0;   v0 = 0
    leaf_average: v1 = (-0.5 + 1 + 0)/2 = 0.25 (the penalty is shared out over 2 leaves)
    """
    parent, depth = [-1, 0, 1, 1], [0, 1, 2, 2]
    reward = [[0], [-0.5], [1], [0]]
    np.testing.assert_allclose(_values(parent, depth, reward)[:, 0], [0, 0, 1, 0])
    np.testing.assert_allclose(
        _values(parent, depth, reward, "leaf_average")[:, 0], [0.25, 0.25, 1, 0]
    )


def test_forest_in_depth_first_order():
    """Two roots, stored depth-first (levels not contiguous), one agent.

    root 0: 0 -> {1, 4}, 1 -> {2, 3}      r2 = 1, r3 = 0, r4 = 1
    root 5: 5 -> {6, 7}                   r6 = 0.5, r7 = -1
    monte_carlo:  v1 = 0.5, v0 = (0.5 + 1)/2 = 0.75, v5 = (0.5 - 1)/2 = -0.25
    leaf_average: v1 = 0.5, v0 = (1 + 0 + 1)/3 = 2/3, v5 = -0.25
    """
    parent = [-1, 0, 1, 1, 0, -1, 5, 5]
    depth = [0, 1, 2, 2, 1, 0, 1, 1]
    reward = [[0], [0], [1], [0], [1], [0], [0.5], [-1]]
    mc = _values(parent, depth, reward)[:, 0]
    la = _values(parent, depth, reward, "leaf_average")[:, 0]
    np.testing.assert_allclose(mc, [0.75, 0.5, 1, 0, 1, -0.25, 0.5, -1])
    np.testing.assert_allclose(la, [2 / 3, 0.5, 1, 0, 1, -0.25, 0.5, -1])


def test_trees_stored_one_after_another():
    """Roots 0, 2, 5 each followed by their children: 0 -> {1}, 2 -> {3, 4}, 5 -> {6, 7}.

    r1 = 1, r3 = 1, r4 = 0, r6 = 0.5, r7 = 0.5
    v0 = 1 (one child), v2 = (1 + 0)/2 = 0.5, v5 = 0.5 (both estimators)
    """
    parent = [-1, 0, -1, 2, 2, -1, 5, 5]
    depth = [0, 1, 0, 1, 1, 0, 1, 1]
    reward = [[0], [1], [0], [1], [0], [0], [0.5], [0.5]]
    for method in ("monte_carlo", "leaf_average"):
        got = _values(parent, depth, reward, method)[:, 0]
        np.testing.assert_allclose(got, [1, 1, 0.5, 1, 0, 0.5, 0.5, 0.5])


def test_children_counts():
    """0 -> {1, 2}, 1 -> {3}; a second root 4 with no children."""
    np.testing.assert_array_equal(children_counts(np.array([-1, 0, 0, 1, -1]), 5), [2, 1, 0, 0, 0])


def test_inputs_are_not_modified_and_empty_forest_works():
    parent, depth = np.array([-1, 0, 0]), np.array([0, 1, 1])
    reward = np.array([[0.0], [1.0], [0.0]])
    before = reward.copy()
    expected_rewards(parent, depth, reward)
    np.testing.assert_array_equal(reward, before)
    empty = expected_rewards(np.zeros(0, int), np.zeros(0, int), np.zeros((0, 3)))
    assert empty.shape == (0, 3)


@pytest.mark.parametrize(
    ("parent", "depth", "reward", "method", "message"),
    [
        ([-1, 2, 0], [0, 1, 1], [[0]] * 3, "monte_carlo", "topological order"),
        ([-1, 0, -2], [0, 1, 0], [[0]] * 3, "monte_carlo", "below -1"),
        ([-1, 0, 1], [0, 1, 1], [[0]] * 3, "monte_carlo", "depth is inconsistent at node 2"),
        ([-1, 0], [0, 1, 2], [[0]] * 2, "monte_carlo", "depth has shape"),
        ([-1, 0], [0, 1], [0, 0], "monte_carlo", "step_reward must have shape"),
        ([-1, 0], [0, 1], [[0], [np.nan]], "monte_carlo", "NaN"),
        ([-1, 0], [0, 1], [[0], [1]], "mean", "unknown expected-reward method 'mean'"),
    ],
)
def test_bad_input_is_named(parent, depth, reward, method, message):
    with pytest.raises(ValueError, match=message):
        expected_rewards(np.array(parent), np.array(depth), np.array(reward), method=method)


@st.composite
def forests(draw):
    """Random forests: 1-3 roots, branching 0-4 (0 = ended early), depth <= 5."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    forest = ref.random_forest(
        rng,
        n_roots=draw(st.integers(1, 3)),
        max_depth=draw(st.integers(0, 5)),
        max_branch=draw(st.integers(1, 4)),
        n_agents=draw(st.integers(1, 3)),
        discrete=draw(st.booleans()),
    )
    if draw(st.booleans()):
        forest = ref.relabel(forest, ref.dfs_permutation(forest["parent"]))
    return forest


@settings(max_examples=150, deadline=None)
@given(forest=forests())
def test_vectorised_values_match_recursive_reference(forest):
    parent, depth, reward = forest["parent"], forest["depth"], forest["step_reward"]
    want_mc = ref.monte_carlo_values(parent.tolist(), reward.tolist())
    want_la = ref.leaf_average_values(parent.tolist(), reward.tolist())
    np.testing.assert_allclose(expected_rewards(parent, depth, reward), want_mc, atol=1e-12)
    np.testing.assert_allclose(
        expected_rewards(parent, depth, reward, "leaf_average"), want_la, atol=1e-12
    )


@pytest.mark.parametrize(("n_roots", "branching", "levels"), [(1, 2, 3), (3, 3, 2), (2, 4, 1)])
def test_balanced_leaf_only_rewards_make_estimators_agree(n_roots, branching, levels):
    """On full trees with reward only at the leaves, mean of children's means == leaf mean."""
    parent, depth = ref.balanced_forest(n_roots, branching, levels)
    rng = np.random.default_rng(0)
    reward = np.where((depth == levels)[:, None], rng.normal(size=(parent.size, 2)), 0.0)
    mc = expected_rewards(parent, depth, reward)
    np.testing.assert_allclose(mc, expected_rewards(parent, depth, reward, "leaf_average"))
    leaf_means = reward[depth == levels].reshape(n_roots, -1, 2).mean(axis=1)
    np.testing.assert_allclose(mc[:n_roots], leaf_means)


def test_module_example_runs():
    import doctest

    from nip_core.malt import expected_reward

    assert doctest.testmod(expected_reward).failed == 0
