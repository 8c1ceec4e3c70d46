"""ROC AUC of the verifier's probability of accepting against the label, bootstrapped.

Decided accuracy hides a model that ranks correct code above buggy code but answers one verdict
every time; AUC shows it. Computed as the Mann-Whitney statistic (the share of (correct, buggy)
episode pairs where the correct one gets the higher probability, ties counting one half), so it
needs no sklearn. A bootstrap resample weights every episode by how often its datapoint was
drawn, which keeps all samples of a datapoint together as the other metrics do. Pure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def pair_order(positive: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """(P, Q) matrix: 1 where positive i scores above negative j, 0.5 on ties, 0 below."""
    diff = positive[:, None] - negative[None, :]
    return (diff > 0).astype(float) + 0.5 * (diff == 0)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """AUC of `scores` for `labels` (1 = positive); NaN without both classes or scores."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels)
    keep = np.isfinite(scores)
    positive, negative = scores[keep & (labels == 1)], scores[keep & (labels != 1)]
    if len(positive) == 0 or len(negative) == 0:
        return float("nan")
    return float(pair_order(positive, negative).mean())


def counts_from_indices(indices: np.ndarray, n: int) -> np.ndarray:
    """(M, n) how often each of n datapoints appears in each of M resamples (rows of indices)."""
    indices = np.atleast_2d(indices)
    counts = np.zeros((len(indices), n))
    np.add.at(counts, (np.arange(len(indices))[:, None], indices), 1.0)
    return counts


class WeightedAuc:
    """AUC of one set of episodes under datapoint weights (a bootstrap resample's counts)."""

    def __init__(self, frame: pd.DataFrame, datapoints: np.ndarray):
        position = {d: i for i, d in enumerate(datapoints.tolist())}
        scored = frame[np.isfinite(frame["p_accept"].astype(float))]
        where = scored["datapoint_id"].map(position).to_numpy()
        positive = scored["y"].eq(1).to_numpy()
        scores = scored["p_accept"].astype(float).to_numpy()
        self.positive_at, self.negative_at = where[positive], where[~positive]
        self.order = pair_order(scores[positive], scores[~positive])

    @property
    def defined(self) -> bool:
        return self.order.size > 0

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        """(M,) AUC per row of datapoint counts (M, N); NaN where a class got no weight."""
        if not self.defined:
            return np.full(len(counts), np.nan)
        w_pos, w_neg = counts[:, self.positive_at], counts[:, self.negative_at]
        numerator = ((w_pos @ self.order) * w_neg).sum(axis=1)
        denominator = w_pos.sum(axis=1) * w_neg.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(
                denominator > 0, numerator / np.where(denominator > 0, denominator, 1), np.nan
            )
