"""Argmax accuracy of models averaged by their P(accept), recomputed from a result folder.

    python scripts/averaged_argmax.py fill-in-choice-control-two-iterations-test \
        malt_t2:1 malt_t2:1+malt_t2_all:2 malt_t2:1+malt_t2:2 base:0+malt_t2:1

One job's draw moves a small test split's reading by several questions. Averaging the
per-episode P(accept) of several models (checkpoints or jobs) before taking the verdict asks
whether the jobs disagree by noise that cancels, or share a ranking. Each argument is one
ensemble, `arm:iteration` terms joined by `+`; a single term reads that model alone. Prints the
argmax accuracy per seed and its mean over the folder's seeds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from nip_core.experiment.summary import argmax_sums  # noqa: E402

RESULTS = REPO / "docs" / "results"
EPISODE = ["seed", "datapoint_id", "sample", "y"]


def parse_ensemble(text: str) -> list[tuple[str, int]]:
    """`a:1+b:2` -> [("a", 1), ("b", 2)]."""
    members = []
    for term in text.split("+"):
        arm, _, iteration = term.rpartition(":")
        if not arm or not iteration.isdigit():
            raise SystemExit(f"{term!r}: expected arm:iteration")
        members.append((arm, int(iteration)))
    return members


def averaged_argmax(episodes: pd.DataFrame, members: list[tuple[str, int]]) -> pd.Series:
    """Argmax accuracy per seed of the members' mean P(accept) on the episodes all of them share."""
    tables = []
    for arm, iteration in members:
        own = episodes[(episodes["arm"] == arm) & (episodes["iteration"] == iteration)]
        if own.empty:
            raise SystemExit(f"{arm}:{iteration}: no episodes in this folder")
        tables.append(own.set_index(EPISODE)["p_accept"].astype(float))
    mean = pd.concat(tables, axis=1, join="inner").mean(axis=1, skipna=False)
    averaged = mean.rename("p_accept").reset_index()
    # the experiment's own argmax rule: a tie counts one half, an episode without P(accept) not at all
    accuracy = {}
    for seed, frame in averaged.groupby("seed"):
        right, scored = argmax_sums(frame, frame["datapoint_id"].unique()).sum(axis=0)
        accuracy[seed] = right / scored
    return pd.Series(accuracy).rename_axis("seed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a folder name under docs/results/")
    parser.add_argument("ensembles", nargs="+", help="arm:iteration terms joined by +")
    args = parser.parse_args()
    episodes = pd.read_parquet(RESULTS / args.folder / "experiment.parquet")
    for text in args.ensembles:
        per_seed = averaged_argmax(episodes, parse_ensemble(text))
        seeds = " ".join(f"{seed} {value:.3f}" for seed, value in per_seed.items())
        print(f"{text}: mean {per_seed.mean():.3f} over {len(per_seed)} seeds ({seeds})")


if __name__ == "__main__":
    main()
