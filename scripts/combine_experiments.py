"""One across-seed summary of seeds that ran as separate experiments of the same recipe.

    python scripts/combine_experiments.py --out docs/results/malt-proper-seeds \
        artifacts/malt-proper-test artifacts/malt-proper-test-7102 artifacts/malt-proper-test-7103

An experiment summarises the seeds it ran; seeds run one experiment at a time (a session's
time, a control added later) have no summary together. This reads every finished seed of the
given experiment folders (`seeds/<seed>/{rows,training,timings}.parquet`), refuses a seed that
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

from nip_core.experiment.seed_outputs import finished_seed, write_outputs
from nip_core.run import provenance
from nip_core.run.artifacts import RunPaths


def finished_seeds(folder: Path) -> dict[int, tuple]:
    """Seed -> (rows, training, timings) of every finished seed of one experiment folder."""
    paths = RunPaths.open(str(folder.parent), folder.name)
    seeds = sorted(int(p.name) for p in (folder / "seeds").iterdir() if p.name.isdigit())
    found = {seed: finished_seed(paths, seed) for seed in seeds}
    return {seed: result for seed, result in found.items() if result is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiments", nargs="+", type=Path, help="experiment folders")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    args = parser.parse_args()
    results: dict[int, tuple] = {}
    for folder in args.experiments:
        for seed, result in finished_seeds(folder).items():
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
