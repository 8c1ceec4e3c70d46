"""Experiment statistics against hand computations on tiny tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nip_core.experiment.auc import counts_from_indices
from nip_core.experiment.summary import (
    argmax_accuracy,
    argmax_sums,
    count_statistics,
    one_level_row,
    summary_table,
    two_level,
)
from nip_core.malt.bootstrap import (
    METRICS,
    bootstrap,
    per_datapoint,
    percentile_ci,
    resample_indices,
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
    unscored = {"p_accept": np.nan}  # no verdict probabilities: AUC undefined, unused here
    trained, base = TRAINED.assign(**unscored), BASE.assign(**unscored)
    statistics = {"diff": count_statistics(trained, base, DATAPOINTS)["diff"]}
    counts = counts_from_indices(np.array([[0, 0], [1, 1], [0, 1]]), 2)
    row = one_level_row(statistics, counts)
    point, low, high = row["diff_vs_base"], row["diff_ci_low"], row["diff_ci_high"]
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
    summary = summary[summary.scope == "seed"]
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


def test_two_level_bootstrap_by_hand():
    """Two seeds, two datapoints, hand-drawn resamples: each resample averages, over its drawn
    seeds, the statistic on that seed's drawn datapoints."""
    seed_a = per_datapoint(BASE, DATAPOINTS)  # accuracy per datapoint: 1/2, 1/2
    seed_b = per_datapoint(TRAINED, DATAPOINTS)  # 2/2, 1/2
    accuracy = METRICS["accuracy"]
    per_seed = [lambda c, s=s: accuracy(c @ s) for s in (seed_a, seed_b)]
    seed_draws = np.array([[0, 1], [1, 1], [0, 0]])
    datapoint_draws = np.array(
        [
            [[0, 0], [0, 1]],  # seed a on {1, 1}: 2/4; seed b on {1, 2}: 3/4 -> 5/8
            [[0, 0], [1, 1]],  # seed b on {1, 1}: 1;   seed b on {2, 2}: 1/2 -> 3/4
            [[1, 1], [0, 1]],  # seed a on {2, 2}: 1/2; seed a on {1, 2}: 1/2 -> 1/2
        ]
    )
    point, low, high = two_level(per_seed, seed_draws, datapoint_draws)
    assert point == pytest.approx((2 / 4 + 3 / 4) / 2)
    assert (low, high) == pytest.approx(tuple(np.percentile([5 / 8, 3 / 4, 1 / 2], [2.5, 97.5])))


def with_probabilities(frame: pd.DataFrame, p: list[float], seed: int) -> pd.DataFrame:
    return frame.assign(p_accept=p, seed=seed)


def test_auc_by_hand():
    from nip_core.experiment.auc import WeightedAuc, auc

    # positives 0.9, 0.4; negatives 0.4, 0.1: pairs (0.9>0.4) 1, (0.9>0.1) 1, tie 0.5, (0.4>0.1) 1
    assert auc(np.array([0.9, 0.4, 0.4, 0.1]), np.array([1, 1, 0, 0])) == pytest.approx(3.5 / 4)
    assert auc(np.array([0.2, 0.8]), np.array([1, 0])) == 0.0
    assert np.isnan(auc(np.array([0.2, 0.8]), np.array([1, 1])))
    assert auc(np.array([0.5, np.nan, 0.4]), np.array([1, 0, 0])) == 1.0  # unscored left out
    frame = pd.DataFrame(
        {"datapoint_id": [1, 1, 2, 3], "y": [1, 1, 0, 0], "p_accept": [0.9, 0.3, 0.5, 0.1]}
    )
    weighted = WeightedAuc(frame, np.array([1, 2, 3]))
    # all once: pairs 0.9>0.5, 0.9>0.1, 0.3<0.5, 0.3>0.1 -> 3/4; datapoint 3 twice, 2 dropped:
    # (0.9>0.1) x2 + (0.3>0.1) x2 over 2 x 2 -> 1; no negative drawn -> NaN
    values = weighted(np.array([[1.0, 1, 1], [1, 0, 2], [1, 0, 0]]))
    assert values[:2] == pytest.approx([3 / 4, 1.0]) and np.isnan(values[2])


def test_summary_across_seeds_and_reference_flags():
    a = with_probabilities(BASE, [0.9, 0.8, 0.2, 0.1], 1)
    b = with_probabilities(BASE, [0.6, 0.6, 0.6, 0.6], 2)
    trained_a = with_probabilities(TRAINED, [0.9, 0.9, 0.1, 0.2], 1)
    trained_b = with_probabilities(TRAINED, [0.7, 0.7, 0.7, 0.7], 2)
    summary = summary_table(pd.concat([a, b, trained_a, trained_b]), resamples=300, seed=4)
    rows = {
        (r.scope, r.seed if r.scope == "seed" else None, r.iteration): r
        for r in summary.itertuples()
    }
    assert rows[("seed", 1, 0)].auc == 1.0 and rows[("seed", 2, 0)].auc == 0.5
    across = rows[("across_seeds", None, 1)]
    assert across.seeds == 2 and across.auc == pytest.approx((1.0 + 0.5) / 2)
    assert across.accuracy == pytest.approx(TRAINED["correct"].mean())  # same episodes per seed
    assert across.auc_ci_low <= across.auc <= across.auc_ci_high
    assert pd.isna(across.seed) and rows[("seed", 2, 1)].seed == 2
    # TRAINED accepts 2 of 3 decided verdicts: inside 0.2-0.8, not flagged
    assert not rows[("seed", 1, 1)].accept_rate_flagged


def test_argmax_accuracy_by_hand():
    """The verdict at temperature 0: P(accept) above one half accepts; a tie counts one half;
    an episode without P(accept) is left out."""
    frame = pd.DataFrame(
        {
            "datapoint_id": [1, 1, 2, 3, 3],
            "y": [1, 1, 0, 0, 0],
            "p_accept": [0.9, 0.4, 0.5, 0.1, np.nan],
        }
    )
    sums = argmax_sums(frame, np.array([1, 2, 3]))
    assert sums.tolist() == [[1.0, 2.0], [0.5, 1.0], [1.0, 1.0]]
    values = argmax_accuracy(sums)(np.array([[1.0, 1, 1], [0, 0, 2], [0, 0, 0]]))
    assert values[:2] == pytest.approx([2.5 / 4, 1.0]) and np.isnan(values[2])


def test_summary_reads_the_argmax_apart_from_the_sampled_verdicts():
    """A trained model whose sampled verdicts improve while its P(accept) ranks no better: the
    sampled accuracy rises, the argmax accuracy and its paired difference do not."""
    base = with_probabilities(BASE, [0.6, 0.6, 0.4, 0.4], 1)
    trained = with_probabilities(TRAINED, [0.6, 0.6, 0.4, 0.4], 1)
    summary = summary_table(pd.concat([base, trained]), resamples=200, seed=3)
    row = summary[(summary.scope == "seed") & (summary.iteration == 1)].iloc[0]
    assert row.accuracy > summary[summary.iteration == 0].iloc[0].accuracy
    assert row.argmax_accuracy == 1.0 and row.argmax_diff_vs_base == 0.0
    assert row.argmax_accuracy_ci_low <= row.argmax_accuracy <= row.argmax_accuracy_ci_high
    unscored = summary_table(pd.concat([BASE, TRAINED]), resamples=20, seed=3)
    assert unscored["argmax_accuracy"].isna().all()
