"""Evaluate a run's models on the test split (or the train split) as a Prefect flow.

    python -m flows.evaluate --run-name exp1 --iteration 2       # models used by iteration 2
    python -m flows.evaluate --set text_rl.test_on_whole_dataset=false --split train

Takes the same options as `flows.malt_iteration` (the configuration must match the run folder's).
`--iteration i` evaluates the models iteration i generates with, i.e. those iteration i-1
switched to; after a run of N iterations, `--iteration N` evaluates the final fine-tuned models.
Writes `iterations/<NNNN>/eval.parquet` (`eval-train.parquet` for --split train), records the
metrics in that iteration's manifest, prints them and logs them to wandb. Runs regardless of
`text_rl.test_scheme`; an evaluation already recorded is reused, not repeated.
"""

from __future__ import annotations

import argparse
import sys

from prefect import flow

from flows.cli import (
    RunSettings,
    add_iteration_argument,
    all_overrides,
    checked_run_arguments,
    open_run,
    resolve_hyper_params,
    run_command,
    run_folder_arguments,
)
from nip_core.data.splits import SPLITS
from nip_core.malt.evaluation import format_metrics
from nip_core.run.artifacts import RunPaths, default_root, read_json
from nip_core.run.run_folder import ConfigError
from nip_core.run.tracking import log_evaluation
from tasks.evaluate import evaluate_task


@flow(name="evaluate", log_prints=True)
def evaluate_flow(
    overrides: list[str] | None = None,
    config: str | None = None,
    run_name: str = "default",
    artifacts_root: str | None = None,
    iteration: int = 0,
    split: str = "test",
    use_wandb: bool = True,
    settings: RunSettings | None = None,
) -> dict:
    """Evaluate the models of `iteration` on `split`; returns the metrics."""
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    hp = resolve_hyper_params(config, all_overrides(settings, overrides))
    root = artifacts_root or default_root()
    require_previous_models(RunPaths.open(root, run_name), iteration)  # before a server starts
    with open_run(hp, root, run_name) as run:  # never beside a training run's writes
        metrics = evaluate_task(run.paths, run.context(iteration), split).metrics
        with run.tracking(use_wandb) as tracker:
            log_evaluation(tracker, metrics, iteration)
    print(f"iteration {iteration} {format_metrics(metrics)}")
    return metrics


def require_previous_models(paths: RunPaths, iteration: int) -> None:
    """Iteration i > 0 uses the models iteration i-1 switched to: they must exist."""
    if iteration == 0:
        return
    manifest = paths.manifest(iteration - 1)
    if not paths.fs.exists(manifest) or "models_after" not in read_json(paths.fs, manifest):
        raise ConfigError(
            f"iteration {iteration - 1} of run {paths.run_dir} has not switched models yet, so "
            f"iteration {iteration}'s models are unknown; run it first or pick an earlier iteration"
        )


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = run_folder_arguments(
        "python -m flows.evaluate",
        "Evaluate a run's current models with one sample per turn "
        "(verifier accuracy, precision, recall, decision rate, episode length).",
    )
    add_iteration_argument(
        parser, "0-based iteration whose models are evaluated (N after N iterations: final models)"
    )
    parser.add_argument("--split", choices=SPLITS, default="test", help="dataset split")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)

    def check():
        hp, root, paths = checked_run_arguments(args)
        if args.split == "validation" and hp.text_rl.validation_fraction == 0:
            raise ConfigError(
                "--split validation needs text_rl.validation_fraction > 0 (the share of train "
                "problems set aside)"
            )
        require_previous_models(paths, args.iteration)
        return root, paths

    def run(checked) -> int:
        root, paths = checked
        metrics = evaluate_flow(
            overrides=args.overrides,
            config=args.config,
            run_name=args.run_name,
            artifacts_root=root,
            iteration=args.iteration,
            split=args.split,
            use_wandb=args.use_wandb,
        )
        print(f"artifacts: {paths.iteration_dir(args.iteration)}")
        print(f"iteration {args.iteration} {format_metrics(metrics)}")
        return 0

    return run_command(args, check, run)


if __name__ == "__main__":
    sys.exit(main())
