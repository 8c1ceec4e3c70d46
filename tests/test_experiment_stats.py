"""Experiment statistics against hand computations on tiny tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nip_core.experiment.stats import (
    METRICS,
    bootstrap,
    paired_difference,
    per_datapoint,
    percentile_ci,
    resample_indices,
    summary_table,
)


def episodes(arm: str, iteration: int, rows: list[tuple[int, int | None, int]]) -> pd.DataFrame:
    """(datapoint_id, decision or None, y) -> experiment rows."""
    frame = pd.DataFrame(rows, columns=["datapoint_id", "decision", "y"])
    frame["decision"] = frame["decision"].astype("Int64")
    frame["correct"] = (frame["decision"] == frame["y"]).fillna(False).astype(bool)
    frame["decided"] = frame["decision"].notna()
    frame["sample"] = frame.groupby("datapoint_id").cumcount()
    frame["arm"], frame["iteration"] = arm, iteration
    frame["model_calls"], frame["tokens"] = 1, 5
    return frame


BASE = episodes("base", 0, [(1, 1, 1), (1, None, 1), (2, 1, 0), (2, 0, 0)])
TRAINED = episodes("malt", 1, [(1, 1, 1), (1, 1, 1), (2, 0, 0), (2, None, 0)])
DATAPOINTS = np.array([1, 2])


def test_per_datapoint_sums_by_hand():
    sums = per_datapoint(BASE, DATAPOINTS)
    # correct, decided, decided&correct, accepted, episodes, correct_y0, n_y0, correct_y1, n_y1
    assert sums.tolist() == [[1, 1, 1, 1, 2, 0, 0, 1, 2], [1, 2, 1, 1, 2, 1, 2, 0, 0]]


def test_metrics_by_hand():
    totals = per_datapoint(BASE, DATAPOINTS).sum(axis=0)
    assert METRICS["accuracy"](totals) == pytest.approx(2 / 4)
    assert METRICS["decision_rate"](totals) == pytest.approx(3 / 4)
    assert METRICS["accuracy_when_decided"](totals) == pytest.approx(2 / 3)
    assert METRICS["accept_rate"](totals) == pytest.approx(2 / 3)
    assert METRICS["balanced_accuracy"](totals) == pytest.approx((1 / 2 + 1 / 2) / 2)


def test_bootstrap_with_hand_drawn_resamples():
    sums = per_datapoint(BASE, DATAPOINTS)
    indices = np.array([[0, 0], [1, 1], [0, 1]])
    # resampled accuracies: datapoint 1 twice = 2/4, datapoint 2 twice = 2/4, both = 2/4
    point, low, high = bootstrap(sums, METRICS["accuracy"], indices)
    assert (point, low, high) == (0.5, 0.5, 0.5)
    # decided accuracy: {1,1}: 2/2 = 1; {2,2}: 2/4 = 0.5; {1,2}: 2/3
    values = np.array([1.0, 0.5, 2 / 3])
    expected = np.percentile(values, [2.5, 97.5])
    _, low, high = bootstrap(sums, METRICS["accuracy_when_decided"], indices)
    assert (low, high) == pytest.approx(tuple(expected))


def test_paired_difference_resamples_the_same_datapoints_on_both_sides():
    trained, base = per_datapoint(TRAINED, DATAPOINTS), per_datapoint(BASE, DATAPOINTS)
    indices = np.array([[0, 0], [1, 1], [0, 1]])
    point, low, high = paired_difference(trained, base, METRICS["accuracy"], indices)
    assert point == pytest.approx(3 / 4 - 2 / 4)
    # per resample: {1,1}: 1 - 0.5; {2,2}: 0.5 - 0.5; {1,2}: 0.75 - 0.5
    expected = np.percentile([0.5, 0.0, 0.25], [2.5, 97.5])
    assert (low, high) == pytest.approx(tuple(expected))


def test_percentile_ci_ignores_undefined_resamples():
    assert percentile_ci(np.array([np.nan, 1.0, 1.0])) == (1.0, 1.0)
    low, high = percentile_ci(np.array([np.nan, np.nan]))
    assert np.isnan(low) and np.isnan(high)


def test_resample_indices_are_seeded_and_checked():
    assert (resample_indices(5, 10, 3) == resample_indices(5, 10, 3)).all()
    with pytest.raises(ValueError, match="empty"):
        resample_indices(0, 10, 3)


def test_summary_accuracy_is_the_mean_of_correct_and_iteration_0_is_the_base():
    experiment = pd.concat([BASE, TRAINED, episodes("ei", 1, [(1, 0, 1), (2, 0, 0)])])
    summary = summary_table(experiment, resamples=200, seed=1)
    assert summary[["arm", "iteration"]].values.tolist() == [
        ["malt", 0],
        ["malt", 1],
        ["ei", 0],
        ["ei", 1],
    ]
    for row in summary.itertuples():
        source = BASE if row.iteration == 0 else experiment[experiment.arm == row.arm]
        assert row.accuracy == pytest.approx(source["correct"].mean())
        assert row.accuracy_ci_low <= row.accuracy <= row.accuracy_ci_high
    base_rows = summary[summary.iteration == 0]
    assert (base_rows.diff_vs_base == 0).all() and (base_rows.diff_ci_low == 0).all()


def test_summary_refuses_datapoints_the_base_did_not_see():
    stray = episodes("malt", 1, [(9, 1, 1)])
    with pytest.raises(ValueError, match="datapoints the base lacks"):
        summary_table(pd.concat([BASE, stray]), resamples=10)
