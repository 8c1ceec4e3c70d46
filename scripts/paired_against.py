"""Paired differences of arms against another arm of the same result folder, not the base model.

    python scripts/paired_against.py rung-e4-from-solo --reference label_pairs:1 \
        --arm nip_from_solo:1 --arm label_pairs_nip_from_solo_nodrift:1

Two arms evaluated on the same seeds' test episodes can be compared pairwise: per seed, the same
datapoints drawn on both sides, and across seeds the summary's two-level bootstrap (seeds, then
datapoints within them). This makes the reference arm the seed's "base" of
`nip_core.experiment.summary.summary_table` and prints, per seed and across seeds, each arm's
decided accuracy and its paired difference from the reference with the 95 % CI.

With `--reference-folder OTHER` the reference arm's episodes come from another result folder of
the same command on the same seeds (an arm run later beside one run before): both folders' base
episodes must be the same draws, or the comparison is refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from nip_core.experiment.summary import summary_table  # noqa: E402

RESULTS = REPO / "docs" / "results"
REFERENCE = "reference"


def arm_iteration(text: str) -> tuple[str, int]:
    arm, _, iteration = text.rpartition(":")
    if not arm or not iteration.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected ARM:ITERATION, e.g. malt:2")
    return arm, int(iteration)


def result_folder(name: str) -> Path:
    return Path(name) if Path(name).is_dir() else RESULTS / name


def against_reference(
    experiment: pd.DataFrame,
    reference: tuple[str, int],
    arms: list[tuple[str, int]],
    resamples: int,
) -> pd.DataFrame:
    """Per-seed and across-seed rows of `arms`, their `decided_diff_vs_base` taken against the
    `reference` arm's episodes at its iteration (which stand in for the base model)."""

    def episodes(arm: str, iteration: int) -> pd.DataFrame:
        rows = experiment[(experiment["arm"] == arm) & (experiment["iteration"] == iteration)]
        if rows.empty:
            raise SystemExit(f"error: no episodes of {arm} at iteration {iteration}")
        return rows

    ref = episodes(*reference).assign(arm=REFERENCE, iteration=0)
    table = pd.concat([ref, *(episodes(*arm) for arm in arms)], ignore_index=True)
    summary = summary_table(table, resamples=resamples, base_arm=REFERENCE)
    # An arm without iteration-0 episodes gets the reference's as its iteration 0: not asked for.
    asked = pd.Series(list(zip(summary["arm"], summary["iteration"], strict=True))).isin(arms)
    keep = asked.to_numpy()
    columns = ["scope", "seed", "arm", "iteration", "seeds", "accuracy_when_decided"]
    columns += ["decided_diff_vs_base", "decided_diff_ci_low", "decided_diff_ci_high"]
    return summary.loc[keep, columns].reset_index(drop=True)


def with_reference_from(
    experiment: pd.DataFrame, other: pd.DataFrame, reference: tuple[str, int]
) -> pd.DataFrame:
    """`experiment` with `other`'s episodes of the `reference` arm on the seeds both hold,
    once the base model's episodes of those seeds are shown to be the same draws."""
    seeds = sorted(set(experiment["seed"]) & set(other["seed"]))
    if not seeds:
        raise SystemExit("error: the two folders share no seed")
    draws = ["seed", "datapoint_id", "sample", "y", "decision"]

    def base(frame: pd.DataFrame) -> pd.DataFrame:
        rows = frame[(frame["arm"] == "base") & frame["seed"].isin(seeds)]
        return rows[draws].sort_values(draws).reset_index(drop=True)

    if not base(experiment).equals(base(other)):
        raise SystemExit("error: the folders' base episodes differ: not the same draws")
    arm, iteration = reference
    ours = (experiment["arm"] == arm) & (experiment["iteration"] == iteration)
    if ours.any():
        raise SystemExit(f"error: {arm} at iteration {iteration} is in both folders")
    theirs = other[(other["arm"] == arm) & (other["iteration"] == iteration)]
    kept = experiment[experiment["seed"].isin(seeds)]
    return pd.concat([kept, theirs[theirs["seed"].isin(seeds)]], ignore_index=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a folder under docs/results, or a path to one")
    parser.add_argument("--reference", type=arm_iteration, required=True, metavar="ARM:ITERATION")
    parser.add_argument(
        "--arm", type=arm_iteration, action="append", required=True, metavar="ARM:ITERATION"
    )
    parser.add_argument("--reference-folder", help="the folder holding the reference arm")
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args()
    experiment = pd.read_parquet(result_folder(args.folder) / "experiment.parquet")
    if args.reference_folder:
        other = pd.read_parquet(result_folder(args.reference_folder) / "experiment.parquet")
        experiment = with_reference_from(experiment, other, args.reference)
    rows = against_reference(experiment, args.reference, args.arm, args.resamples)
    rows = rows.rename(columns={"decided_diff_vs_base": f"minus {args.reference[0]}"})
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        print(rows.to_string(index=False))


if __name__ == "__main__":
    main()
