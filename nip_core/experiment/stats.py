"""Experiment statistics: per-episode rows, bootstrap confidence intervals, the summary table.

Every interval is a 95 % percentile bootstrap that resamples *test datapoints* (all samples of a
datapoint move together, since they share its difficulty), seeded, so a summary is reproducible.
A paired difference resamples the same datapoints for both sides: the base model and a trained
model are evaluated on identical datapoints and episode seeds, which is what makes small
improvements measurable. Pure: pandas/numpy in, pandas out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

EXPERIMENT_COLUMNS = (
    "arm",
    "iteration",
    "datapoint_id",
    "sample",
    "decision",
    "y",
    "correct",
    "decided",
    "model_calls",
    "tokens",
)
SUMMARY_COLUMNS = (
    "arm",
    "iteration",
    "accuracy",
    "accuracy_ci_low",
    "accuracy_ci_high",
    "decision_rate",
    "accuracy_when_decided",
    "diff_vs_base",
    "diff_ci_low",
    "diff_ci_high",
    "train_model_calls",
    "wall_seconds",
)
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
    sums = parts.groupby(frame["datapoint_id"].to_numpy()).sum()
    return sums.reindex(datapoints, fill_value=0.0).to_numpy()


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


# Each metric reads the per-datapoint sums (summed over a resample, last axis = the columns).
METRICS: dict[str, Statistic] = {
    "accuracy": lambda s: _ratio(s[..., 0], s[..., 4]),
    "decision_rate": lambda s: _ratio(s[..., 1], s[..., 4]),
    "accuracy_when_decided": lambda s: _ratio(s[..., 2], s[..., 1]),
    "accept_rate": lambda s: _ratio(s[..., 3], s[..., 1]),
    "balanced_accuracy": lambda s: (
        (_ratio(s[..., 5], s[..., 6]) + _ratio(s[..., 7], s[..., 8])) / 2
    ),
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


def paired_difference(
    sums: np.ndarray, base_sums: np.ndarray, statistic: Statistic, indices: np.ndarray
) -> tuple[float, float, float]:
    """(difference, CI low, CI high) of statistic(sums) - statistic(base_sums), where every
    resample takes the same datapoints on both sides (rows of both arrays are aligned)."""
    point = float(statistic(sums.sum(axis=0)) - statistic(base_sums.sum(axis=0)))
    resampled = statistic(sums[indices].sum(axis=1)) - statistic(base_sums[indices].sum(axis=1))
    return (point, *percentile_ci(resampled))


def summary_row(
    frame: pd.DataFrame,
    base: pd.DataFrame,
    datapoints: np.ndarray,
    indices: np.ndarray,
) -> dict:
    """Every metric with its CI, the paired differences against the base, and decided accuracy
    against chance (0.5: the splits are balanced)."""
    sums, base_sums = per_datapoint(frame, datapoints), per_datapoint(base, datapoints)
    row: dict = {}
    for name, statistic in METRICS.items():
        point, low, high = bootstrap(sums, statistic, indices)
        row[name], row[f"{name}_ci_low"], row[f"{name}_ci_high"] = point, low, high
    row["diff_vs_base"], row["diff_ci_low"], row["diff_ci_high"] = paired_difference(
        sums, base_sums, METRICS["accuracy"], indices
    )
    decided = paired_difference(sums, base_sums, METRICS["accuracy_when_decided"], indices)
    row["decided_diff_vs_base"], row["decided_diff_ci_low"], row["decided_diff_ci_high"] = decided
    row["decided_vs_chance"] = row["accuracy_when_decided"] - 0.5
    row["episodes"] = len(frame)
    return row


def summary_table(
    experiment: pd.DataFrame,
    *,
    resamples: int = 2000,
    seed: int = 0,
    base_arm: str = "base",
    timings: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per (arm, iteration) of `experiment` (columns `EXPERIMENT_COLUMNS`).

    The base model's rows (`arm == base_arm`, iteration 0) are shown as iteration 0 of every
    other arm too, so each learning curve starts from the same point. `timings` (columns arm,
    iteration, train_model_calls, wall_seconds) is merged in when given.
    """
    missing = set(EXPERIMENT_COLUMNS) - set(experiment.columns)
    if missing:
        raise ValueError(f"experiment table lacks columns {sorted(missing)}")
    base = experiment[(experiment["arm"] == base_arm) & (experiment["iteration"] == 0)]
    if base.empty:
        raise ValueError(f"no rows of the base model (arm {base_arm!r}, iteration 0)")
    datapoints = np.sort(base["datapoint_id"].unique())
    indices = resample_indices(len(datapoints), resamples, seed)
    arms = [a for a in dict.fromkeys(experiment["arm"]) if a != base_arm]
    rows = []
    for arm in arms:
        own = experiment[experiment["arm"] == arm]
        curve = [(0, base)] + [
            (int(it), group) for it, group in own.groupby("iteration", sort=True) if it != 0
        ]
        for iteration, frame in curve:
            stray = set(frame["datapoint_id"]) - set(datapoints)
            if stray:
                raise ValueError(
                    f"arm {arm} iteration {iteration} has datapoints the base lacks: "
                    f"{sorted(stray)[:5]}"
                )
            rows.append(
                {"arm": arm, "iteration": iteration} | summary_row(frame, base, datapoints, indices)
            )
    table = pd.DataFrame(rows)
    if timings is not None and not table.empty:
        table = table.merge(timings, on=["arm", "iteration"], how="left")
    for column in ("train_model_calls", "wall_seconds"):
        if column not in table:
            table[column] = np.nan
    return table[list(SUMMARY_COLUMNS) + [c for c in table.columns if c not in SUMMARY_COLUMNS]]
