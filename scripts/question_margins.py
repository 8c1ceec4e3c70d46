"""Which questions a pairwise arm learned: each question's probability of the right version.

    python scripts/question_margins.py fill-in-choice-nothing-test --arm malt_t2

In the pair protocols a datapoint is one question shown in one order (`pair_id`; the question is
its buggy row, `pair_buggy_id`), and P(the verifier picks the
correct solution) is P(accept) where Solution A is correct, 1 - P(accept) where it is not. Its
mean over a question's episodes tells a question the model is sure of (> 0.9) from a near tie
(0.4-0.6), which the decided accuracy mixes and the argmax hides. Prints, for the base model
(arm `base`, averaged over seeds) and for every trained model (seed, iteration): how many
questions it ranks right, holds surely and holds as a near tie; then how many questions every
trained model ranks right, none does, or some do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from nip_core.data.pairwise import pair_buggy_id  # noqa: E402

RESULTS = REPO / "docs" / "results"


def right_version_probability(episodes: pd.DataFrame, arm: str) -> pd.DataFrame:
    """One row a question, one column a model: "base", then "<seed>.<iteration>"."""
    if not (episodes["arm"] == arm).any():
        raise ValueError(f"no episodes of arm {arm!r}")
    rows = episodes[episodes["arm"].isin([arm, "base"])].copy()
    rows["question"] = rows["datapoint_id"].map(pair_buggy_id)
    rows["p_right"] = rows["p_accept"].where(rows["y"] == 1, 1.0 - rows["p_accept"])
    base = rows[rows["arm"] == "base"].groupby("question")["p_right"].mean().rename("base")
    trained = rows[(rows["arm"] == arm) & (rows["iteration"] > 0)]
    columns = trained["seed"].astype(str) + "." + trained["iteration"].astype(str)
    table = trained.assign(model=columns).pivot_table(
        index="question", columns="model", values="p_right", aggfunc="mean"
    )
    return pd.concat([base, table], axis=1)


def model_counts(table: pd.DataFrame) -> pd.DataFrame:
    """Per model: questions ranked right, held surely (> 0.9), held as a near tie (0.4-0.6)."""
    return pd.DataFrame(
        {
            "right": (table > 0.5).sum(),
            "sure": (table > 0.9).sum(),
            "near_tie": table.apply(lambda c: c.between(0.4, 0.6)).sum(),
        }
    )


def agreement(table: pd.DataFrame) -> dict[str, int]:
    """Questions every trained model ranks right, none does, and some do."""
    right = table.drop(columns="base") > 0.5
    every, none = right.all(axis=1), ~right.any(axis=1)
    return {"every": int(every.sum()), "none": int(none.sum()), "some": int((~every & ~none).sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a folder under docs/results, or a path to one")
    parser.add_argument("--arm", required=True)
    args = parser.parse_args()
    folder = Path(args.folder) if Path(args.folder).is_dir() else RESULTS / args.folder
    episodes = folder / "experiment.parquet"
    if not episodes.is_file():
        raise SystemExit(f"error: {episodes} not found (a result folder's episodes)")
    try:
        table = right_version_probability(pd.read_parquet(episodes), args.arm)
    except ValueError as error:
        raise SystemExit(f"error: {folder.name}: {error}") from None
    print(f"{folder.name}, {args.arm}: {len(table)} questions")
    for model, row in model_counts(table).iterrows():
        print(f"  {model}: right {row.right}, sure {row.sure}, near tie {row.near_tie}")
    counts = agreement(table)
    print(
        f"  trained models: every one right on {counts['every']}, none on {counts['none']}, "
        f"some on {counts['some']}"
    )


if __name__ == "__main__":
    main()
