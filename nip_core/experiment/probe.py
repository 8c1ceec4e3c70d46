"""Linear probes: does a model's representation already tell correct code from buggy code?

When fine-tuning leaves a verifier at chance on a bug grade, either the training failed to
find a signal the model carries, or the model does not carry one. A logistic regression on the
frozen model's hidden states (one feature vector per problem and solution) tells the two apart:
if no linear read-out of them ranks held-out correct code above buggy code, a LoRA adapter
trained on a hundred verdicts has little to build on. The regularisation is chosen by
cross-validation with every question's solutions kept in one fold, so a probe cannot score by
recognising a question it saw with the other label. Pure numpy, no sklearn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nip_core.experiment.auc import auc

L2_GRID: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0, 1000.0)


def standardised(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both sets scaled by the train set's mean and spread (constant features left at 0)."""
    mean, spread = train.mean(axis=0), train.std(axis=0)
    spread = np.where(spread > 0, spread, 1.0)
    return (train - mean) / spread, (test - mean) / spread


def _with_bias(x: np.ndarray) -> np.ndarray:
    return np.hstack([x, np.ones((len(x), 1))])


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float, iterations: int = 50) -> np.ndarray:
    """Weights (the bias last) of an L2-penalised logistic regression, by Newton's method: the
    penalty keeps the problem strictly convex even with more features than rows, and the bias
    is not penalised."""
    design, target = _with_bias(np.asarray(x, float)), np.asarray(y, float)
    penalty = np.full(design.shape[1], float(l2))
    penalty[-1] = 0.0
    weights = np.zeros(design.shape[1])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(design @ weights)))
        gradient = design.T @ (p - target) + penalty * weights
        curvature = (design * (p * (1 - p))[:, None]).T @ design + np.diag(penalty + 1e-9)
        step = np.linalg.solve(curvature, gradient)
        weights -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return weights


def logistic_scores(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The probe's logit for every row (its ranking is what AUC reads)."""
    return _with_bias(np.asarray(x, float)) @ weights


def grouped_folds(groups: Sequence, folds: int, seed: int) -> list[np.ndarray]:
    """Row indices of each held-out fold, every group's rows in one fold, groups dealt out in a
    seeded order."""
    names = np.array(sorted(set(groups), key=str), dtype=object)
    np.random.default_rng(seed).shuffle(names)
    fold_of = {name: i % folds for i, name in enumerate(names)}
    assigned = np.array([fold_of[g] for g in groups])
    return [np.flatnonzero(assigned == i) for i in range(folds) if (assigned == i).any()]


def cross_validated_scores(
    x: np.ndarray, y: np.ndarray, groups: Sequence, l2: float, folds: int = 5, seed: int = 0
) -> np.ndarray:
    """Every row's score from a probe fitted on the folds that do not hold its question."""
    x, y = np.asarray(x, float), np.asarray(y)
    scores = np.full(len(y), np.nan)
    for held in grouped_folds(groups, folds, seed):
        rest = np.setdiff1d(np.arange(len(y)), held)
        train, test = standardised(x[rest], x[held])
        scores[held] = logistic_scores(test, fit_logistic(train, y[rest], l2))
    return scores


def twin_outcomes(
    scores: np.ndarray, labels: np.ndarray, groups: Sequence
) -> list[tuple[int, int, float]]:
    """(correct row, buggy row, outcome) for each group holding both a correct (1) and a buggy
    (0) row: outcome 1 where the correct row scores higher, 0.5 on a tie, 0 below."""
    rows_of: dict = {}
    for index, (label, group) in enumerate(zip(labels, groups, strict=True)):
        rows_of.setdefault(group, {})[int(label)] = index
    outcomes = []
    for rows in rows_of.values():
        if set(rows) == {0, 1}:
            correct, buggy = float(scores[rows[1]]), float(scores[rows[0]])
            outcome = 1.0 if correct > buggy else 0.5 if correct == buggy else 0.0
            outcomes.append((rows[1], rows[0], outcome))
    return outcomes


def paired_accuracy(scores: np.ndarray, labels: np.ndarray, groups: Sequence) -> float:
    """Share of the groups holding both a correct (1) and a buggy (0) row whose correct row
    scores higher (ties count one half): 0.5 for anything that reads only the question."""
    outcomes = [outcome for _, _, outcome in twin_outcomes(scores, labels, groups)]
    return float(np.mean(outcomes)) if outcomes else float("nan")


@dataclass(frozen=True)
class ProbeResult:
    l2: float  # the penalty cross-validation chose
    validation_auc: float  # grouped cross-validated, on the train rows
    validation_paired_accuracy: float
    test_auc: float
    test_paired_accuracy: float
    validation_scores: np.ndarray = field(repr=False)  # each train row's held-out score
    test_scores: np.ndarray = field(repr=False)

    def metrics(self) -> dict[str, float]:
        """The numbers, without the scores."""
        return {k: v for k, v in vars(self).items() if not k.endswith("_scores")}


def probe(
    train_x: np.ndarray,
    train_y: np.ndarray,
    train_groups: Sequence,
    test_x: np.ndarray,
    test_y: np.ndarray,
    test_groups: Sequence,
    l2_grid: Sequence[float] = L2_GRID,
    seed: int = 0,
) -> ProbeResult:
    """Choose the penalty on the train rows (the best grouped cross-validated AUC), fit on all
    of them, and score the test rows."""
    train_y = np.asarray(train_y)
    held_out = {
        l2: cross_validated_scores(train_x, train_y, train_groups, l2, seed=seed) for l2 in l2_grid
    }
    validation = {l2: auc(scores, train_y) for l2, scores in held_out.items()}
    l2 = max(l2_grid, key=lambda value: np.nan_to_num(validation[value], nan=-1.0))
    train, test = standardised(np.asarray(train_x, float), np.asarray(test_x, float))
    scores = logistic_scores(test, fit_logistic(train, train_y, l2))
    return ProbeResult(
        l2=float(l2),
        validation_auc=float(validation[l2]),
        validation_paired_accuracy=paired_accuracy(held_out[l2], train_y, train_groups),
        test_auc=auc(scores, np.asarray(test_y)),
        test_paired_accuracy=paired_accuracy(scores, np.asarray(test_y), test_groups),
        validation_scores=held_out[l2],
        test_scores=scores,
    )
