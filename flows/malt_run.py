"""A whole MALT run: `rl.num_iterations` iterations, each resuming from its own manifest.

    python -m flows.malt_run                              # embedded default configuration
    python -m flows.malt_run --set rl.num_iterations=3 --run-name exp1

Every iteration uses the models the previous one switched to (stored in its manifest), so a
killed run restarted with the same arguments continues where it stopped. The self-hosted server,
when the configuration needs one and nothing answers on its port, is started once for the run.
"""

from __future__ import annotations

import argparse
import sys

from prefect import flow

from flows.cli import (
    RunSettings,
    TaskRunnerKind,
    all_overrides,
    checked_run_arguments,
    open_run,
    resolve_hyper_params,
    run_command,
    run_folder_arguments,
)
from flows.pipeline import run_iteration
from nip_core.parameters import HyperParameters
from nip_core.run.artifacts import RunPaths
from nip_core.run.lock import clear_stale_lock
from nip_core.run.run_folder import finished_iteration_stats


@flow(name="malt-run", log_prints=True)
def malt_run(
    overrides: list[str] | None = None,
    config: str | None = None,
    run_name: str = "default",
    artifacts_root: str | None = None,
    use_wandb: bool = True,
    settings: RunSettings | None = None,
    task_runner: TaskRunnerKind = "thread",
    task_runner_address: str | None = None,
) -> list[dict]:
    """Run (or resume) every iteration of a run; returns each iteration's statistics."""
    hp = resolve_hyper_params(config, all_overrides(settings, overrides))
    runner = {"task_runner": task_runner, "task_runner_address": task_runner_address}
    with open_run(hp, artifacts_root, run_name, **runner) as run:  # once for the whole run
        with run.tracking(use_wandb) as tracker:
            results = []
            for iteration in range(hp.rl.num_iterations):
                # A subflow: one flow run per iteration in the UI.
                stats = run_iteration(run, iteration, tracker, as_subflow=True)
                print(f"iteration {iteration}: verifier accuracy {stats['verifier']['accuracy']}")
                results.append(stats)
            return results


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = run_folder_arguments(
        "python -m flows.malt_run",
        "Run or resume a whole MALT run: rl.num_iterations iterations, each a subflow that "
        "resumes from its own manifest.",
    )
    return parser.parse_args(argv)


def all_iterations_finished(hp: HyperParameters, paths: RunPaths, run_name: str) -> bool:
    return all(
        finished_iteration_stats(paths, hp, run_name, i) is not None
        for i in range(hp.rl.num_iterations)
    )


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)

    def run(checked) -> int:
        hp, root, paths = checked
        if all_iterations_finished(hp, paths, args.run_name):  # nothing to start
            if paths.is_local:
                clear_stale_lock(paths.run_dir)  # left by a run killed while shutting down
        else:
            malt_run(
                args.overrides,
                args.config,
                args.run_name,
                root,
                use_wandb=args.use_wandb,
                task_runner=args.task_runner,
                task_runner_address=args.task_runner_address,
            )
        print(f"artifacts: {paths.run_dir}")
        return 0

    return run_command(args, lambda: checked_run_arguments(args), run)


if __name__ == "__main__":
    sys.exit(main())
