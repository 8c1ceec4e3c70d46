"""A whole MALT run: `rl.num_iterations` iterations, each resuming from its own manifest.

    python -m flows.malt_run                              # embedded default configuration
    python -m flows.malt_run --set rl.num_iterations=3 --run-name exp1

Every iteration uses the models the previous one switched to (stored in its manifest), so a
killed run restarted with the same arguments continues where it stopped. The self-hosted server,
when the configuration needs one and nothing answers on its port, is started once for the run.
"""

from __future__ import annotations

import sys

from prefect import flow

from flows.malt_iteration import (
    ConfigError,
    checked_run_arguments,
    parse_args,
    prepare_run,
    previous_group_models,
    resolve_hyper_params,
    run_iteration_stages,
)
from nip_core.lm_server.launch import ensure_lm_server
from nip_core.parameters import HyperParameters
from nip_core.run.artifacts import ArtifactError, RunPaths, default_root
from nip_core.run.iteration_context import build_context
from nip_core.run.lock import RunLockedError, lock_run_folder
from nip_core.run.tracking import open_tracker


@flow(name="malt-run", log_prints=True)
def malt_run(
    overrides: list[str] | None = None,
    config: str | None = None,
    run_name: str = "default",
    artifacts_root: str | None = None,
    use_wandb: bool = True,
) -> list[dict]:
    """Run (or resume) every iteration of a run; returns each iteration's statistics."""
    hp = resolve_hyper_params(config, overrides)
    root = artifacts_root or default_root()
    with lock_run_folder(RunPaths.open(root, run_name)):  # once for the whole run
        return run_all_iterations(hp, root, run_name, use_wandb)


def run_all_iterations(
    hp: HyperParameters, root: str, run_name: str, use_wandb: bool = True
) -> list[dict]:
    """Every iteration in order; the caller holds the run-folder lock."""
    paths = prepare_run(hp, root, run_name)
    server = ensure_lm_server(paths, build_context(hp, run_name, 0))
    tracker = open_tracker(paths, hp, run_name, use_wandb)
    try:
        results = []
        for iteration in range(hp.rl.num_iterations):
            context = build_context(
                hp, run_name, iteration, previous_group_models(paths, iteration)
            )
            stats = run_iteration_stages(paths, context, tracker)
            print(f"iteration {iteration}: verifier accuracy {stats['verifier']['accuracy']}")
            results.append(stats)
        return results
    finally:
        tracker.finish()
        if server is not None:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        _, root, paths = checked_run_arguments(args)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        malt_run(args.overrides, args.config, args.run_name, root, use_wandb=args.use_wandb)
    except (ConfigError, ArtifactError, RunLockedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"artifacts: {paths.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
