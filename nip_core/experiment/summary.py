"""The summary table: per seed, and across seeds with a two-level bootstrap.

Per seed, every metric's 95 % CI resamples test datapoints (`nip_core.malt.bootstrap`). Across
seeds, the point estimate is the mean of the seeds' estimates and each bootstrap resample first
draws seeds with replacement, then datapoints within each drawn seed: the interval then covers
both what another training run (seed) and what another test set would change. Paired
differences against the base use the same draws on both sides, within each seed. Pure:
pandas/numpy in, pandas out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from nip_core.experiment.auc import WeightedAuc, counts_from_indices
from nip_core.experiment.stats import ACCEPT_RATE_BAND, EXPERIMENT_COLUMNS, SUMMARY_COLUMNS
from nip_core.malt.bootstrap import (
    METRICS,
    per_datapoint,
    percentile_ci,
    ratio,
    resample_indices,
    sums_by_datapoint,
)

# A statistic of datapoint counts: (M, N) how often each datapoint is drawn -> (M,) values.
CountStatistic = Callable[[np.ndarray], np.ndarray]
# Output columns (point, CI low, CI high) of each statistic.
COLUMNS = {
    name: (name, f"{name}_ci_low", f"{name}_ci_high")
    for name in (*METRICS, "auc", "argmax_accuracy")
} | {
    "diff": ("diff_vs_base", "diff_ci_low", "diff_ci_high"),
    "decided_diff": ("decided_diff_vs_base", "decided_diff_ci_low", "decided_diff_ci_high"),
    "argmax_diff": ("argmax_diff_vs_base", "argmax_diff_ci_low", "argmax_diff_ci_high"),
}


def argmax_sums(frame: pd.DataFrame, datapoints: np.ndarray) -> np.ndarray:
    """Per-datapoint (right by P(accept)'s argmax, episodes with a P(accept)), rows aligned to
    `datapoints`: the verdict the verifier would give at temperature 0 (a tie counts one half)."""
    p = frame["p_accept"].astype(float)
    scored = np.isfinite(p)
    agrees = (p > 0.5) == frame["y"].eq(1)
    right = np.where(p == 0.5, 0.5, agrees.astype(float))
    parts = pd.DataFrame({"right": np.where(scored, right, 0.0), "scored": scored.astype(float)})
    return sums_by_datapoint(parts, frame["datapoint_id"], datapoints)


def argmax_accuracy(sums: np.ndarray) -> CountStatistic:
    """Accuracy of P(accept)'s argmax under datapoint counts; NaN where nothing was scored."""
    return lambda counts: ratio(counts @ sums[:, 0], counts @ sums[:, 1])


def count_statistics(
    frame: pd.DataFrame, base: pd.DataFrame, datapoints: np.ndarray
) -> dict[str, CountStatistic]:
    """Every summary statistic of one evaluation (and its seed's base) as a function of counts."""
    sums, base_sums = per_datapoint(frame, datapoints), per_datapoint(base, datapoints)

    def metric(statistic):
        return lambda counts: statistic(counts @ sums)

    def paired(statistic):
        return lambda counts: statistic(counts @ sums) - statistic(counts @ base_sums)

    out: dict[str, CountStatistic] = {name: metric(s) for name, s in METRICS.items()}
    out["auc"] = WeightedAuc(frame, datapoints)
    out["diff"] = paired(METRICS["accuracy"])
    out["decided_diff"] = paired(METRICS["accuracy_when_decided"])
    own, base_argmax = (argmax_accuracy(argmax_sums(f, datapoints)) for f in (frame, base))
    out["argmax_accuracy"] = own
    out["argmax_diff"] = lambda counts: own(counts) - base_argmax(counts)
    return out


def one_level_row(statistics: Mapping[str, CountStatistic], counts: np.ndarray) -> dict:
    """Point estimates (every datapoint once) and CIs over the resampled counts."""
    whole = np.ones((1, counts.shape[1]))
    row: dict = {}
    for name, statistic in statistics.items():
        point, low, high = COLUMNS[name]
        row[point] = float(statistic(whole)[0])
        row[low], row[high] = percentile_ci(statistic(counts))
    return row


def two_level_indices(
    n_seeds: int, n_datapoints: int, resamples: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(R, S) drawn seeds and (R, S, N) drawn datapoints within each drawn seed."""
    if n_seeds < 1 or n_datapoints < 1:
        raise ValueError("cannot bootstrap without seeds and datapoints")
    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, n_seeds, size=(resamples, n_seeds))
    return seeds, rng.integers(0, n_datapoints, size=(resamples, n_seeds, n_datapoints))


def two_level(
    per_seed: list[CountStatistic], seed_draws: np.ndarray, datapoint_draws: np.ndarray
) -> tuple[float, float, float]:
    """(mean over seeds, CI low, CI high): each resample averages its drawn seeds' statistic
    over that seed's drawn datapoints."""
    n = datapoint_draws.shape[-1]
    points = [float(statistic(np.ones((1, n)))[0]) for statistic in per_seed]
    values = np.full(seed_draws.shape, np.nan)
    for s, statistic in enumerate(per_seed):
        drawn = seed_draws == s
        if drawn.any():
            values[drawn] = statistic(counts_from_indices(datapoint_draws[drawn], n))
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(finite, values, 0).sum(axis=1) / finite.sum(axis=1)
    point = float(np.nanmean(points)) if np.isfinite(points).any() else float("nan")
    return (point, *percentile_ci(means))


def curves(own: pd.DataFrame, base: pd.DataFrame) -> list[tuple[int, pd.DataFrame]]:
    """(iteration, episodes) of one arm in one seed: a trained arm's curve starts at the base
    model (iteration 0); an arm with rows at iteration 0 (a reference rule) is its own."""
    groups = [(int(it), group) for it, group in own.groupby("iteration", sort=True)]
    return groups if any(it == 0 for it, _ in groups) else [(0, base), *groups]


def seed_and_base_rows(
    experiment: pd.DataFrame, seed: int, base_arm: str
) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """(the seed's rows, its base model's rows, the sorted datapoints the base was evaluated
    on)."""
    own = experiment[experiment["seed"] == seed]
    base = own[(own["arm"] == base_arm) & (own["iteration"] == 0)]
    if base.empty:
        raise ValueError(f"seed {seed}: no rows of the base model (arm {base_arm!r}, iteration 0)")
    return own, base, np.sort(base["datapoint_id"].unique())


def seed_rows(
    seed: int,
    parts: tuple[pd.DataFrame, pd.DataFrame, np.ndarray],
    base_arm: str,
    counts: np.ndarray,
) -> tuple[list[dict], dict[tuple[str, int], dict]]:
    """One seed's summary rows and its statistics per (arm, iteration); `parts` as
    `seed_and_base_rows` gives them."""
    own, base, datapoints = parts
    rows, cells = [], {}
    for arm in [a for a in dict.fromkeys(own["arm"]) if a != base_arm]:
        for iteration, frame in curves(own[own["arm"] == arm], base):
            stray = set(frame["datapoint_id"]) - set(datapoints)
            if stray:
                raise ValueError(
                    f"seed {seed} arm {arm} iteration {iteration} has datapoints the base "
                    f"lacks: {sorted(stray)[:5]}"
                )
            statistics = count_statistics(frame, base, datapoints)
            cells[(arm, iteration)] = statistics
            rows.append(
                {"scope": "seed", "seed": seed, "arm": arm, "iteration": iteration}
                | one_level_row(statistics, counts)
                | {"episodes": len(frame), "seeds": 1}
            )
    return rows, cells


def across_seed_row(arm: str, iteration: int, per_seed: list[dict], draws) -> dict:
    row = {"scope": "across_seeds", "seed": None, "arm": arm, "iteration": iteration}
    for name in per_seed[0]:
        point, low, high = COLUMNS[name]
        row[point], row[low], row[high] = two_level([c[name] for c in per_seed], *draws)
    return row


def summary_table(
    experiment: pd.DataFrame,
    *,
    resamples: int = 2000,
    seed: int = 0,
    base_arm: str = "base",
    timings: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per-seed rows (scope "seed") and across-seed rows (scope "across_seeds", seed null) per
    (arm, iteration) of `experiment` (columns `EXPERIMENT_COLUMNS`; without `seed`, one seed).

    `timings` (seed, arm, iteration, train_model_calls, wall_seconds) is merged in when given;
    across seeds it is the mean."""
    if "seed" not in experiment:
        experiment = experiment.assign(seed=0)
    if "p_accept" not in experiment:
        experiment = experiment.assign(p_accept=np.nan)
    missing = set(EXPERIMENT_COLUMNS) - set(experiment.columns)
    if missing:
        raise ValueError(f"experiment table lacks columns {sorted(missing)}")
    parts = {
        int(s): seed_and_base_rows(experiment, int(s), base_arm)
        for s in sorted(experiment["seed"].unique())
    }
    sizes = {len(datapoints) for _, _, datapoints in parts.values()}
    if len(sizes) != 1:
        raise ValueError(
            f"seeds were evaluated on different numbers of datapoints: {sorted(sizes)}"
        )
    n = sizes.pop()
    # Every seed resamples its datapoints with the same draws (common random numbers).
    counts = counts_from_indices(resample_indices(n, resamples, seed), n)
    rows, by_cell = [], {}
    for s, seed_parts in parts.items():
        own_rows, cells = seed_rows(s, seed_parts, base_arm, counts)
        rows += own_rows
        for key, statistics in cells.items():
            by_cell.setdefault(key, []).append(statistics)
    for (arm, iteration), per_seed in by_cell.items():
        draws = two_level_indices(len(per_seed), n, resamples, seed)
        episodes = sum(
            r["episodes"] for r in rows if (r["arm"], r["iteration"]) == (arm, iteration)
        )
        row = across_seed_row(arm, iteration, per_seed, draws)
        rows.append(row | {"episodes": episodes, "seeds": len(per_seed)})
    return finish(pd.DataFrame(rows), timings)


def with_timings(table: pd.DataFrame, timings: pd.DataFrame | None) -> pd.DataFrame:
    """Per-seed rows get their seed's record; across-seed rows the mean over seeds."""
    columns = ["train_model_calls", "wall_seconds"]
    if timings is None or timings.empty:
        return table.assign(**{c: np.nan for c in columns})
    timings = timings.assign(seed=timings["seed"] if "seed" in timings else 0)
    timings = timings.astype({"seed": "Int64"})
    keys = ["seed", "arm", "iteration"]
    across = timings.groupby(["arm", "iteration"], as_index=False)[columns].mean()
    per_seed = table[table["scope"] == "seed"].merge(timings, on=keys, how="left")
    overall = table[table["scope"] != "seed"].merge(across, on=["arm", "iteration"], how="left")
    return pd.concat([per_seed, overall], ignore_index=True)


def finish(table: pd.DataFrame, timings: pd.DataFrame | None) -> pd.DataFrame:
    """Flags, timings and the column order."""
    if table.empty:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    table["seed"] = table["seed"].astype("Int64")
    low, high = ACCEPT_RATE_BAND
    rate = table["accept_rate"]
    table["accept_rate_flagged"] = (rate < low) | (rate > high)
    table["decided_vs_chance"] = table["accuracy_when_decided"] - 0.5
    table = with_timings(table, timings)
    return table[list(SUMMARY_COLUMNS) + [c for c in table.columns if c not in SUMMARY_COLUMNS]]
