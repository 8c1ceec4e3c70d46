"""Linear probes on frozen features (nip_core.experiment.probe): planted signals are found,
noise and question identity are not mistaken for one."""

import numpy as np
import pytest

from nip_core.experiment.auc import auc
from nip_core.experiment.probe import (
    cross_validated_scores,
    fit_logistic,
    grouped_folds,
    logistic_scores,
    paired_accuracy,
    probe,
    twin_outcomes,
)


def twins(questions: int, dims: int, signal: float, seed: int):
    """Every question twice, correct (1) and buggy (0): features are the question's own random
    vector (shared by both rows) plus `signal` along the first axis for correct rows."""
    rng = np.random.default_rng(seed)
    question_vectors = rng.normal(size=(questions, dims))
    x = np.repeat(question_vectors, 2, axis=0) + rng.normal(size=(2 * questions, dims)) * 0.5
    y = np.tile([1, 0], questions)
    x[:, 0] += signal * y
    return x, y, [f"q{i}" for i in range(questions) for _ in range(2)]


def test_newton_fit_matches_the_penalised_optimum_on_a_tiny_problem():
    x = np.array([[0.0], [1.0], [2.0], [3.0]])
    y = np.array([0, 0, 1, 1])
    weights = fit_logistic(x, y, l2=1.0)
    p = 1 / (1 + np.exp(-logistic_scores(x, weights)))
    # At the optimum the penalised gradient is zero: X^T (p - y) + l2 * w (bias unpenalised).
    assert np.allclose(x[:, 0] @ (p - y) + 1.0 * weights[0], 0, atol=1e-8)
    assert np.isclose((p - y).sum(), 0, atol=1e-8)
    assert weights[0] > 0


def test_more_features_than_rows_still_converges():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(10, 50)), np.array([0, 1] * 5)
    assert np.all(np.isfinite(fit_logistic(x, y, l2=0.1)))


def test_folds_keep_each_question_whole_and_cover_every_row():
    groups = ["a", "a", "b", "b", "c", "c", "d", "d", "e", "e"]
    folds = grouped_folds(groups, folds=3, seed=1)
    assert sorted(np.concatenate(folds).tolist()) == list(range(10))
    for fold in folds:
        names = {groups[i] for i in fold}
        assert all(groups.count(name) == sum(groups[i] == name for i in fold) for name in names)


def test_a_planted_signal_is_found_on_held_out_questions():
    train = twins(60, 20, signal=3.0, seed=0)
    test = twins(30, 20, signal=3.0, seed=1)
    result = probe(*train, *test)
    assert result.test_auc > 0.9
    assert result.test_paired_accuracy > 0.9
    assert result.validation_auc > 0.9
    assert result.validation_paired_accuracy > 0.9
    assert not np.isnan(result.validation_scores).any()


def test_question_identity_alone_is_not_a_signal():
    """Without the planted axis the rows of a question differ by noise only: the probe sits at
    chance on new questions, however well it could memorise the train questions."""
    train = twins(60, 20, signal=0.0, seed=0)
    test = twins(40, 20, signal=0.0, seed=2)
    result = probe(*train, *test)
    assert 0.3 < result.test_auc < 0.7
    assert 0.25 < result.test_paired_accuracy < 0.75
    assert auc(cross_validated_scores(*train, l2=0.1), train[1]) < 0.7


def test_paired_accuracy_counts_questions_with_both_labels():
    scores = np.array([0.9, 0.1, 0.2, 0.8, 0.5, 0.5, 0.7])
    labels = np.array([1, 0, 1, 0, 1, 0, 1])
    groups = ["a", "a", "b", "b", "c", "c", "lonely"]
    assert paired_accuracy(scores, labels, groups) == pytest.approx((1 + 0 + 0.5) / 3)
    assert np.isnan(paired_accuracy(scores[-1:], labels[-1:], groups[-1:]))
    assert twin_outcomes(scores, labels, groups) == [(0, 1, 1.0), (2, 3, 0.0), (4, 5, 0.5)]
