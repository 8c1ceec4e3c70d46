"""One across-seed summary of seeds that ran as separate experiments of the same recipe.

    python scripts/combine_experiments.py --out docs/results/malt-proper-seeds \
        artifacts/malt-proper-test artifacts/malt-proper-test-7102 artifacts/malt-proper-test-7103

An experiment summarises the seeds it ran; seeds run one experiment at a time (a session's
time, a control added later) have no summary together. This reads every finished seed of the
given experiment folders (`seeds/<seed>/{rows,training,timings}.parquet`) and result folders it
wrote before (`docs/results/<name>/`: their experiment, training and summary tables, so that a
published result takes new seeds whose artifacts are all that is left), refuses a seed that
two of them hold, and writes experiment.parquet, summary.parquet, training.parquet,
experiment.png and experiment.html for all of them into `--out`, as the experiment would: arms
a seed did not run are summarised over the seeds that ran them. `provenance.json` carries the
experiments' own records (commit, machine, command, every arm's configuration, wall time; see
`nip_core.run.provenance`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from nip_core.experiment.seed_outputs import TIMING_COLUMNS, finished_seed, write_outputs
from nip_core.run import provenance
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_files import EXPERIMENT_FILE, SUMMARY_FILE, TRAINING_FILE


def finished_seeds(folder: Path) -> dict[int, tuple]:
    """Seed -> (rows, training, timings) of every finished seed of one experiment folder."""
    paths = RunPaths.open(str(folder.parent), folder.name)
    seeds = sorted(int(p.name) for p in (folder / "seeds").iterdir() if p.name.isdigit())
    found = {seed: finished_seed(paths, seed) for seed in seeds}
    return {seed: result for seed, result in found.items() if result is not None}


def published_seeds(folder: Path) -> dict[int, tuple]:
    """Seed -> (rows, training, timings) of every seed of a result folder: its rows and
    training tables split by seed, its timings from the summary's per-seed rows."""
    rows = pd.read_parquet(folder / EXPERIMENT_FILE)
    training = pd.read_parquet(folder / TRAINING_FILE)
    summary = pd.read_parquet(folder / SUMMARY_FILE)
    timed = summary[(summary["scope"] == "seed") & summary["wall_seconds"].notna()]
    timings = timed[TIMING_COLUMNS].astype({"seed": "int64", "iteration": "int64"})

    def of(frame: pd.DataFrame, seed: int) -> pd.DataFrame:
        return frame[frame["seed"] == seed].reset_index(drop=True)

    return {
        int(seed): (of(rows, seed), of(training, seed), of(timings, seed))
        for seed in sorted(rows["seed"].unique())
    }


def seeds_of(folder: Path) -> dict[int, tuple]:
    """An experiment folder's finished seeds, or a result folder's seeds."""
    if not (folder / "seeds").is_dir() and (folder / EXPERIMENT_FILE).is_file():
        return published_seeds(folder)
    return finished_seeds(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "experiments", nargs="+", type=Path, help="experiment folders or result folders"
    )
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    args = parser.parse_args()
    results: dict[int, tuple] = {}
    for folder in args.experiments:
        for seed, result in seeds_of(folder).items():
            if seed in results:
                parser.error(f"seed {seed} is in more than one of the experiments given")
            results[seed] = result
    if not results:
        parser.error("no finished seed in the experiments given")
    seeds = sorted(results)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = write_outputs(
        RunPaths.open(str(args.out.parent), args.out.name),
        [results[s][0] for s in seeds],
        pd.concat([results[s][2] for s in seeds], ignore_index=True),
        pd.concat([results[s][1] for s in seeds], ignore_index=True),
        resamples=args.resamples,
        seed=args.seed,
        title=f"Seeds {', '.join(map(str, seeds))} of {len(args.experiments)} experiments",
    )
    records = {}
    for folder in args.experiments:
        path = folder / provenance.PROVENANCE_FILE
        records[folder.name] = json.loads(path.read_text()) if path.exists() else {}
    combined = provenance.result_provenance(records, sys.argv)
    (args.out / provenance.PROVENANCE_FILE).write_text(json.dumps(combined, indent=1) + "\n")
    across = summary[summary["scope"] == "across_seeds"]
    columns = ["arm", "iteration", "seeds", "decision_rate", "accuracy_when_decided", "auc"]
    print(across[[c for c in columns if c in across]].round(3).to_string(index=False))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
