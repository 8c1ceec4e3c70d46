"""Percentile bootstrap over test datapoints: per-datapoint sums, metrics and 95 % intervals.

Every interval resamples *test datapoints* (all samples of a datapoint move together, since they
share its difficulty), seeded, so a result is reproducible. An evaluation's summary
(`malt.evaluation.judging_metrics`) and an experiment's summary (`experiment.summary`, which
also pairs the base model's and a trained model's draws on identical datapoints and episode
seeds) both read these. Pure: pandas/numpy in, numbers out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

ALPHA = 0.05

# A statistic of one resample: per-datapoint sums (rows = datapoints) -> value (NaN if undefined).
Statistic = Callable[[np.ndarray], np.ndarray]


def per_datapoint(frame: pd.DataFrame, datapoints: np.ndarray) -> np.ndarray:
    """Per-datapoint sums, rows aligned to `datapoints`: correct, decided, decided and correct,
    accepted (decision 1), episodes, and (correct, episodes) within each label y = 0 / y = 1."""
    decided = frame["decision"].notna()
    accepted = frame["decision"].fillna(-1).eq(1)
    correct = frame["correct"].astype(bool)
    y1 = frame["y"].eq(1)
    parts = pd.DataFrame(
        {
            "correct": correct,
            "decided": decided,
            "decided_correct": decided & correct,
            "accepted": accepted,
            "episodes": 1,
            "correct_y0": correct & ~y1,
            "episodes_y0": ~y1,
            "correct_y1": correct & y1,
            "episodes_y1": y1,
        }
    ).astype(float)
    return sums_by_datapoint(parts, frame["datapoint_id"], datapoints)


def sums_by_datapoint(parts: pd.DataFrame, ids: pd.Series, datapoints: np.ndarray) -> np.ndarray:
    """Each column of `parts` summed per datapoint id, rows aligned to `datapoints` (zeros for a
    datapoint without rows)."""
    sums = parts.groupby(ids.to_numpy()).sum()
    return sums.reindex(datapoints, fill_value=0.0).to_numpy()


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den elementwise; NaN where den is 0 (a resample without the denominator's rows)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


# Each metric reads the per-datapoint sums (summed over a resample, last axis = the columns).
METRICS: dict[str, Statistic] = {
    "accuracy": lambda s: ratio(s[..., 0], s[..., 4]),
    "decision_rate": lambda s: ratio(s[..., 1], s[..., 4]),
    "accuracy_when_decided": lambda s: ratio(s[..., 2], s[..., 1]),
    "accept_rate": lambda s: ratio(s[..., 3], s[..., 1]),
    "balanced_accuracy": lambda s: (ratio(s[..., 5], s[..., 6]) + ratio(s[..., 7], s[..., 8])) / 2,
    # Accuracy on the episodes of each label: on correct and on buggy code for a solo verifier;
    # with the correct solution shown first and second in the pairwise protocol (position bias).
    "accuracy_y1": lambda s: ratio(s[..., 7], s[..., 8]),
    "accuracy_y0": lambda s: ratio(s[..., 5], s[..., 6]),
}


def resample_indices(n: int, resamples: int, seed: int) -> np.ndarray:
    """(resamples, n) datapoint indices drawn with replacement."""
    if n == 0:
        raise ValueError("cannot bootstrap an empty set of datapoints")
    if resamples < 1:
        raise ValueError(f"bootstrap resamples must be >= 1, got {resamples}")
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def percentile_ci(values: np.ndarray, alpha: float = ALPHA) -> tuple[float, float]:
    """(low, high) percentiles of the finite resampled values; NaNs when none is finite."""
    finite = values[np.isfinite(values)]
    if len(finite) == 0:
        return float("nan"), float("nan")
    low, high = np.percentile(finite, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(low), float(high)


def bootstrap(
    sums: np.ndarray, statistic: Statistic, indices: np.ndarray
) -> tuple[float, float, float]:
    """(point estimate, CI low, CI high) of `statistic` over datapoints resampled by `indices`."""
    point = float(statistic(sums.sum(axis=0)))
    resampled = statistic(sums[indices].sum(axis=1))
    return (point, *percentile_ci(resampled))
