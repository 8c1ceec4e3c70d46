"""Does a solo verifier's verdict rank a correct solution above its own buggy twin?

A solo verifier is scored on each solution alone (accuracy, AUC across problems). The frozen
model's likelihood holds a trace of a bug relative to its twin only (docs/learning.md, "Where the
medium and mixed grades stop"); this asks whether a verifier's verdict holds that relative trace
even where it has no absolute one. For every arm and iteration of experiment folders (their
`seeds/*/rows.parquet`, or `experiment.parquet`) it averages P(accept) over a solution's episodes
and counts the questions whose correct solution scores above its buggy twin (ties one half):
0.5 for anything that reads only the question. Twins share a question: datapoint id // 1000 in
`humaneval-buggy`. Pooled over seeds, with a 95 % bootstrap interval over (seed, question).

    python scripts/twin_ranking.py docs/results/medium-malt-proper docs/results/medium-label-pairs
"""

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from nip_core.experiment.probe import twin_outcomes  # noqa: E402


def folder_rows(folder: Path) -> pd.DataFrame:
    """Every episode row of an experiment folder."""
    files = sorted(folder.glob("seeds/*/rows.parquet")) or sorted(folder.glob("experiment.parquet"))
    if not files:
        raise SystemExit(f"{folder}: no episode rows (seeds/*/rows.parquet or experiment.parquet)")
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def twin_table(rows: pd.DataFrame, draws: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per (arm, iteration): questions with both twins scored, the share ranked right, its 95 %
    bootstrap interval, and the same per seed."""
    rng = np.random.default_rng(seed)
    scored = rows[np.isfinite(rows["p_accept"].astype(float))]
    records = []
    for (arm, iteration), episodes in scored.groupby(["arm", "iteration"], sort=True):
        solutions = episodes.groupby(["seed", "datapoint_id"], as_index=False).agg(
            p_accept=("p_accept", "mean"), y=("y", "first")
        )
        groups = list(zip(solutions["seed"], solutions["datapoint_id"] // 1000, strict=True))
        twins = twin_outcomes(solutions["p_accept"].to_numpy(), solutions["y"].to_numpy(), groups)
        if not twins:
            continue
        outcomes = np.array([o for _, _, o in twins])
        boot = rng.choice(outcomes, size=(draws, outcomes.size)).mean(axis=1)
        seed_of = solutions["seed"].to_numpy()
        by_seed = pd.Series(outcomes).groupby([int(seed_of[c]) for c, _, _ in twins]).mean()
        per_seed = {int(s): round(float(v), 3) for s, v in by_seed.items()}
        records.append(
            {
                "arm": arm,
                "iteration": int(iteration),
                "questions": int(outcomes.size),
                "twin_accuracy": float(outcomes.mean()),
                "ci_low": float(np.quantile(boot, 0.025)),
                "ci_high": float(np.quantile(boot, 0.975)),
                "per_seed": per_seed,
            }
        )
    return pd.DataFrame.from_records(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args()
    print("| folder | arm | iteration | questions | twin accuracy [95 % CI] | per seed |")
    print("|---|---|---|---|---|---|")
    for folder in args.folders:
        for r in twin_table(folder_rows(folder)).itertuples():
            seeds = ", ".join(f"{v:.3f}" for v in r.per_seed.values())
            print(
                f"| {folder.name} | `{r.arm}` | {r.iteration} | {r.questions} | "
                f"{r.twin_accuracy:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] | {seeds} |"
            )


if __name__ == "__main__":
    main()
