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
from pathlib import Path

from prefect import flow

from nip_core.lm_server.launch import ensure_lm_server
from nip_core.malt.evaluation import format_metrics, should_evaluate
from nip_core.parameters import HyperParameters, load_hyper_params
from nip_core.run.artifacts import ArtifactError, RunPaths, default_root, read_json, write_json
from nip_core.run.iteration_context import IterationContext, build_context
from nip_core.run.lock import RunLockedError, lock_run_folder
from nip_core.run.tracking import Tracker, log_iteration, open_tracker
from tasks.batch import select_batch_task
from tasks.evaluate import evaluate_task
from tasks.export import export_datasets_task
from tasks.fine_tune import fine_tune_task, switch_model_task
from tasks.pairs import select_pairs_task
from tasks.prefect_artifacts import publish_summary_task
from tasks.rewards import estimate_rewards_task
from tasks.rollouts import generate_rollouts_task
from tasks.summary import summarise_iteration_task
from tasks.switch_guard import switch_guard_task

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


class ConfigError(ValueError):
    """A bad configuration: reported as one line, nothing written."""


def resolve_hyper_params(config: str | None, overrides: list[str] | None) -> HyperParameters:
    path = Path(config) if config else DEFAULT_CONFIG
    try:
        return load_hyper_params(path, list(overrides or []))
    except (ValueError, KeyError, TypeError, FileNotFoundError, OSError) as e:
        raise ConfigError(f"{path}: {e}") from e


def prepare_run(hp: HyperParameters, root: str, run_name: str) -> RunPaths:
    """Open the run folder; its stored configuration must match (resume never asks questions)."""
    paths = RunPaths.open(root, run_name)
    stored = paths.hyper_params
    if paths.fs.exists(stored):
        previous = HyperParameters.from_dict(read_json(paths.fs, stored))
        if previous.config_hash() != hp.config_hash():
            raise ConfigError(
                f"run folder {paths.run_dir} holds a different configuration; "
                "use another --run-name or the same settings"
            )
    else:
        write_json(paths.fs, stored, hp.to_dict(include_package_meta=True))
    return paths


def previous_group_models(paths: RunPaths, iteration: int) -> dict[str, str]:
    """Models the previous iteration switched to (empty for the first iteration)."""
    if iteration == 0 or not paths.fs.exists(paths.manifest(iteration - 1)):
        return {}
    manifest = read_json(paths.fs, paths.manifest(iteration - 1))
    return dict(manifest.get("models_after", {}))


@flow(name="malt-iteration", log_prints=True)
def malt_iteration(
    overrides: list[str] | None = None,
    config: str | None = None,
    run_name: str = "default",
    artifacts_root: str | None = None,
    iteration: int = 0,
    use_wandb: bool = True,
) -> dict:
    """Run (or resume) one iteration and return its summary statistics."""
    hp = resolve_hyper_params(config, overrides)
    root = artifacts_root or default_root()
    with lock_run_folder(RunPaths.open(root, run_name)):  # one writer per run folder
        paths = prepare_run(hp, root, run_name)
        context = build_context(hp, run_name, iteration, previous_group_models(paths, iteration))
        tracker = open_tracker(paths, hp, run_name, use_wandb)
        try:
            return run_iteration_stages(paths, context, tracker)
        finally:
            tracker.finish()


def run_iteration_stages(
    paths: RunPaths, context: IterationContext, tracker: Tracker | None = None
) -> dict:
    """All stages of one iteration; the caller holds the run-folder lock."""
    server = ensure_lm_server(paths, context)
    try:
        select_batch_task(paths, context)
        generate_rollouts_task(paths, context)
        estimate_rewards_task(paths, context)
        if not context.is_ei_iteration:
            select_pairs_task(paths, context)
        export_datasets_task(paths, context)
        stats = summarise_iteration_task(paths, context)
        hp = context.hyper_params
        if should_evaluate(hp.text_rl.test_scheme, context.iteration, hp.rl.num_iterations):
            stats["eval"] = evaluate_task(paths, context)
        if tracker is not None:
            log_iteration(tracker, stats, context.iteration)
        fine_tune_task(paths, context)
        candidates = switch_model_task(paths, context)
        stats["models_after"] = switch_guard_task(paths, context, candidates)
        publish_summary_task(paths, context, stats)
        return stats
    finally:
        if server is not None:
            server.stop()


def format_summary(paths: RunPaths, context: IterationContext, stats: dict) -> str:
    verifier = stats["verifier"]
    lines = [
        f"artifacts: {paths.iteration_dir(context.iteration)}",
        f"protocol {context.protocol.name}, {'EI (SFT)' if context.is_ei_iteration else 'MALT (DPO)'}"
        f" iteration {context.iteration}: {stats['datapoints']} datapoints, "
        f"{stats['nodes_per_datapoint']:.1f} nodes per datapoint",
    ]
    for agent, agent_stats in stats["agents"].items():
        proportion = agent_stats["pair_proportion"]
        lines.append(
            f"  {agent}: {agent_stats['pairs']} pairs, pair proportion "
            f"{'n/a' if proportion is None else f'{proportion:.3f}'}"
        )
    accuracy = verifier["accuracy"]
    lines.append(f"  verifier accuracy: {'n/a' if accuracy is None else f'{accuracy:.3f}'}")
    if stats.get("eval"):
        lines.append(f"  {format_metrics(stats['eval'])}")
    for group, model in stats.get("models_after", {}).items():
        lines.append(f"  group {group} -> model {model}")
    return "\n".join(lines)


def run_folder_arguments(
    prog: str,
    description: str,
    *,
    config_help: str = f"YAML or JSON hyper-parameters (default: {DEFAULT_CONFIG})",
    set_help: str = "dotted override, repeatable, e.g. --set agents.verifier.temperature=0.7",
    run_name: str = "default",
    run_name_help: str = "folder under the artifacts root",
) -> argparse.ArgumentParser:
    """The options of every command that writes a run folder: configuration, overrides, run
    name, artifacts root and wandb."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help=config_help)
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=set_help
    )
    parser.add_argument("--run-name", default=run_name, help=run_name_help)
    parser.add_argument(
        "--artifacts-root",
        default=None,
        help="root folder or fsspec URL (default: $NIP_ARTIFACTS_ROOT or ./artifacts)",
    )
    parser.add_argument(
        "--no-wandb",
        dest="use_wandb",
        action="store_false",
        help="do not track with wandb (default: offline wandb run under <run folder>/wandb)",
    )
    return parser


def run_arguments(prog: str, description: str, iteration_help: str) -> argparse.ArgumentParser:
    """The options every run command shares: `run_folder_arguments` plus the iteration."""
    parser = run_folder_arguments(prog, description)
    parser.add_argument("--iteration", type=int, default=0, help=iteration_help)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = run_arguments(
        "python -m flows.malt_iteration",
        "Run or resume one MALT iteration (tree rollouts, expected rewards, preference pairs, "
        "Parquet datasets, fine-tuning, model switch).",
        "0-based iteration number",
    )
    return parser.parse_args(argv)


def checked_run_arguments(args: argparse.Namespace) -> tuple[HyperParameters, str, RunPaths]:
    """What every run command checks before writing anything: (hyper-parameters, root, paths).

    Raises ConfigError or ValueError (bad configuration, negative iteration, bad run name).
    """
    hp = resolve_hyper_params(args.config, args.overrides)
    if args.iteration < 0:
        raise ConfigError(f"--iteration must be >= 0, got {args.iteration}")
    root = args.artifacts_root or default_root()
    return hp, root, RunPaths.open(root, args.run_name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        hp, root, paths = checked_run_arguments(args)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        stats = malt_iteration(
            overrides=args.overrides,
            config=args.config,
            run_name=args.run_name,
            artifacts_root=root,
            iteration=args.iteration,
            use_wandb=args.use_wandb,
        )
    except (ConfigError, ArtifactError, RunLockedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_summary(paths, build_context(hp, args.run_name, args.iteration), stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
