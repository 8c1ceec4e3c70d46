"""One MALT (or expert-iteration) iteration as a Prefect flow.

    python -m flows.malt_iteration                      # embedded default configuration
    python -m flows.malt_iteration --set interaction_protocol=debate --set rl.rollouts_per_iteration=8
    python -m flows.malt_iteration --config my.yaml --run-name exp1 --iteration 2

Stages: select-batch -> generate-rollouts -> estimate-rewards -> select-pairs -> export-datasets
-> summarise -> [evaluate, per text_rl.test_scheme] -> fine-tune -> switch-model.
Statistics go to wandb (offline under <run folder>/wandb unless configured; --no-wandb: off).
Each writes its artifacts under <artifacts-root>/<run-name>/iterations/<NNNN>/ and records itself
in manifest.json; rerunning skips finished stages, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import sys

from prefect import flow

from flows.cli import (
    RunSettings,
    TaskRunnerKind,
    add_iteration_argument,
    all_overrides,
    checked_run_arguments,
    open_run,
    resolve_hyper_params,
    run_command,
    run_folder_arguments,
)
from flows.pipeline import format_summary, run_iteration
from nip_core.run.iteration_context import build_context
from nip_core.run.lock import clear_stale_lock
from nip_core.run.run_folder import finished_iteration_stats


@flow(name="malt-iteration", log_prints=True)
def malt_iteration(
    overrides: list[str] | None = None,
    config: str | None = None,
    run_name: str = "default",
    artifacts_root: str | None = None,
    iteration: int = 0,
    use_wandb: bool = True,
    settings: RunSettings | None = None,
    task_runner: TaskRunnerKind = "thread",
    task_runner_address: str | None = None,
) -> dict:
    """Run (or resume) one iteration and return its summary statistics."""
    hp = resolve_hyper_params(config, all_overrides(settings, overrides))
    runner = {"task_runner": task_runner, "task_runner_address": task_runner_address}
    with open_run(hp, artifacts_root, run_name, **runner) as run:  # one writer per run folder
        with run.tracking(use_wandb) as tracker:
            return run_iteration(run, iteration, tracker)


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = run_folder_arguments(
        "python -m flows.malt_iteration",
        "Run or resume one MALT iteration (tree rollouts, expected rewards, preference pairs, "
        "Parquet datasets, fine-tuning, model switch).",
    )
    add_iteration_argument(parser, "0-based iteration number")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)

    def run(checked) -> int:
        hp, root, paths = checked
        # A finished iteration answers from its manifest: no Prefect server, no model call.
        stats = finished_iteration_stats(paths, hp, args.run_name, args.iteration)
        if stats is not None and paths.is_local:
            clear_stale_lock(paths.run_dir)  # left by a run killed while shutting down
        if stats is None:
            stats = malt_iteration(
                overrides=args.overrides,
                config=args.config,
                run_name=args.run_name,
                artifacts_root=root,
                iteration=args.iteration,
                use_wandb=args.use_wandb,
                task_runner=args.task_runner,
                task_runner_address=args.task_runner_address,
            )
        print(format_summary(paths, build_context(hp, args.run_name, args.iteration), stats))
        return 0

    return run_command(args, lambda: checked_run_arguments(args), run)


if __name__ == "__main__":
    sys.exit(main())
