"""The summary of one experiment seed whose arms have not all finished.

    python scripts/partial_seed_summary.py --config configs/experiment-cpu-easy.yaml \
        --experiment artifacts/experiment --seed 6198

The experiment writes a seed's rows only once every arm of it finished; this reads the base
evaluation, the reference arms and whichever arms have an evaluated iteration, and prints the
same summary rows (per seed; bootstrap over datapoints) the experiment would.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from nip_core.experiment.arm_results import evaluation_rows, reference_arm_rows
from nip_core.experiment.config import (
    BASE_RUN,
    all_arms,
    base_hyper_params,
    parse_settings,
    split_config,
    with_seed,
)
from nip_core.experiment.summary import summary_table
from nip_core.malt.evaluation import file_stem
from nip_core.parameters import HyperParameters
from nip_core.parameters.loading import read_params_file
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_files import table_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--experiment", required=True, help="the experiment's folder")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args()
    data, section = split_config(read_params_file(Path(args.config)))
    settings, hp = parse_settings(section), HyperParameters.from_dict(data)
    base, arms = base_hyper_params(hp, settings), all_arms(hp, settings)
    split, seed = settings.evaluation_split, args.seed
    seed_root = Path(args.experiment) / "seeds" / str(seed)
    base_rows = evaluation_rows(RunPaths.open(str(seed_root), BASE_RUN), BASE_RUN, 0, split, seed)
    frames = [base_rows, reference_arm_rows(with_seed(base, seed), base_rows, split)]
    for arm in arms:
        paths = RunPaths.open(str(seed_root / "arms"), arm)
        for it in range(1, settings.iterations + 1):
            evaluated = Path(paths.iteration_file(it, table_file(file_stem(split))))
            if evaluated.exists():
                frames.append(evaluation_rows(paths, arm, it, split, seed))
            else:
                print(f"{arm} iteration {it}: not evaluated yet")
    summary = summary_table(pd.concat(frames, ignore_index=True), resamples=args.resamples)
    rows = summary[summary["scope"] == "seed"]
    wanted = ["arm", "iteration", "episodes", "decision_rate"] + [
        f"{name}{part}"
        for name in ("accuracy_when_decided", "accept_rate", "auc", "decided_diff")
        for part in ("", "_ci_low", "_ci_high")
    ]
    rows = rows.rename(columns={"decided_diff_vs_base": "decided_diff"})
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(rows[wanted].round(3).to_string(index=False))


if __name__ == "__main__":
    main()
