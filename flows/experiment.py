"""Does training make a better verifier? Several arms from one config, learning curves with CIs.

    python -m flows.experiment                      # configs/experiment-cpu-easy.yaml
    python -m flows.experiment --config configs/experiment-cpu-pairwise.yaml --run-name exp1 \
        --set experiment.seeds=5

The config is a normal hyper-parameter file plus an `experiment:` section (arms, iterations,
samples per held-out datapoint, seeds; see nip_core/experiment/config.py). Under
<artifacts-root>/<experiment>/ it writes, for every seed:
- seeds/<seed>/base/: a run folder whose iteration 0 evaluates the base models (shared by every
  arm of the seed);
- seeds/<seed>/arms/<arm>/: one run folder per arm: N training iterations, each followed by an
  evaluation of the models it switched to (stored as the next iteration's evaluation), with the
  verifier's P(accept) per episode (`eval-verdicts.parquet`);
- seeds/<seed>/rows.parquet, training.parquet and timings.parquet once the seed finished (a
  rerun skips it);
and for the experiment:
- experiment.parquet (one row per seed, arm, iteration, datapoint, sample; the reference arms
  always_accept, always_reject and one_feature_rule scored on the base model's episodes),
  summary.parquet (per seed, and across seeds with a two-level bootstrap: 95 % CIs, AUC, paired
  differences against the base model, accept rates outside 0.2-0.8 flagged), training.parquet
  (the trainer's steps and dataset per seed, arm and iteration), experiment.png and
  experiment.html.
Seeds run one after another against one server, or side by side (`experiment.parallel_seeds`;
by default 4 where a CUDA GPU serves them), each in a worker process of Prefect's
ProcessPoolTaskRunner with a server of its own. Everything resumes: rerunning finished work
makes no model call.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml
from prefect import flow, get_client, task
from prefect.task_runners import ProcessPoolTaskRunner

from flows.cli import (
    OpenRun,
    RunSettings,
    all_overrides,
    check_run_providers,
    open_run,
    run_command,
    run_folder_arguments,
)
from flows.lm_server import server_engine, side_by_side_urls
from flows.pipeline import iteration_subflow
from nip_core.data.pairwise import shows_pairs
from nip_core.experiment.arm_results import (
    evaluation_rows,
    read_likelihoods,
    reference_arm_rows,
    score_likelihoods,
    score_verdicts,
)
from nip_core.experiment.config import (
    BASE_RUN,
    ExperimentSettings,
    all_arms,
    arm_start,
    base_hyper_params,
    experiment_overrides,
    parse_settings,
    samples_alike,
    seed_list,
    settings_with_overrides,
    split_config,
    start_overrides,
    with_seed,
)
from nip_core.experiment.report import summary_text
from nip_core.experiment.seed_outputs import (
    SeedResult,
    finished_seed,
    record_seed,
    record_timing,
    timings_table,
    training_table,
)
from nip_core.lm_server.training import has_cuda
from nip_core.malt.evaluation import format_metrics
from nip_core.parameters import HyperParameters
from nip_core.parameters.loading import apply_overrides, read_params_file
from nip_core.protocols.build import make_protocol
from nip_core.run import provenance
from nip_core.run.artifacts import RunPaths, default_root
from nip_core.run.iteration_context import build_context
from nip_core.run.lock import lock_run_folder
from nip_core.run.run_folder import ConfigError, check_writable
from nip_core.run.tracking import Tracker, log_evaluation, open_tracker
from tasks.evaluate import evaluate_task
from tasks.experiment import write_outputs_task

# The easy grade, where the shipped recipe learns (the mixed grade's experiment-cpu.yaml sits at
# chance: docs/results.md).
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "experiment-cpu-easy.yaml"


@dataclass(frozen=True)
class Experiment:
    """A checked experiment: the base configuration, its settings and every arm's."""

    base: HyperParameters
    settings: ExperimentSettings
    arms: dict[str, HyperParameters]


def resolve_experiment(config: str | None, overrides: list[str] | None) -> Experiment:
    """Load and check everything (every arm's configuration too) before anything runs."""
    path = Path(config) if config else DEFAULT_CONFIG
    try:
        data, section = split_config(read_params_file(path))
        plain, own = experiment_overrides(list(overrides or []))
        settings = parse_settings(section)
        if own:
            parsed = {k: yaml.safe_load(v) for k, v in own.items()}
            settings = parse_settings(settings_with_overrides(vars(settings), parsed))
        hp = apply_overrides(HyperParameters.from_dict(data), plain)
        return Experiment(base_hyper_params(hp, settings), settings, all_arms(hp, settings))
    except (ValueError, KeyError, TypeError, OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: {e}") from e


def evaluate_iteration(
    run: OpenRun, iteration: int, split: str, tracker: Tracker | None = None
) -> dict:
    """Evaluate the models of `iteration` (the base models for 0) on `split`, with the
    verifier's P(accept) per episode."""
    context = run.context(iteration)
    evaluation = evaluate_task(run.paths, context, split)
    print(f"{run.run_name} iteration {iteration} {format_metrics(evaluation.metrics)}")
    score_verdicts(run.paths, context, split, evaluation.nodes_file)
    if tracker is not None:
        log_evaluation(tracker, evaluation.metrics, iteration)
    return evaluation.metrics


def run_arm(
    run: OpenRun, settings: ExperimentSettings, use_wandb: bool, evaluate_start: bool = False
) -> None:
    """The arm's iterations (`rl.num_iterations`: the experiment's, unless the arm sets fewer),
    each followed by an evaluation of the models it switched to; with `evaluate_start` (an arm
    starting from another arm's models) its starting models are evaluated first."""
    tracker = open_tracker(run.paths, run.hp, run.run_name, use_wandb)
    try:
        if evaluate_start:
            evaluate_iteration(run, 0, settings.evaluation_split, tracker)
        for iteration in range(run.hp.rl.num_iterations):
            context = run.context(iteration)
            started = time.monotonic()
            iteration_subflow(run.paths, context)
            record_timing(run.paths, iteration, time.monotonic() - started)
            evaluate_iteration(run, iteration + 1, settings.evaluation_split, tracker)
    finally:
        tracker.finish()


def run_seed(
    spec: Experiment,
    seed: int,
    experiment_root: str,
    use_wandb: bool,
    server_url: str | None = None,
) -> SeedResult:
    """The base evaluation and every arm for one seed; (experiment rows, training, timings).
    `server_url`: the seed's own server (a worker process's), else the configured one."""
    split, iterations = spec.settings.evaluation_split, spec.settings.iterations
    seed_root = f"{experiment_root}/seeds/{seed}"
    base, arms_root = with_seed(spec.base, seed), f"{seed_root}/arms"
    arm_paths, final_models = {}, {}
    starts = {arm: arm_start(spec.settings, arm) for arm in spec.arms}
    with open_run(base, seed_root, BASE_RUN, server_url=server_url) as base_run:
        base_paths = base_run.paths
        evaluate_iteration(base_run, 0, split)
        if shows_pairs(base.interaction_protocol):  # the likelihood baseline's scores
            score_likelihoods(base_paths, base_run.context(0), split)
        for arm, arm_hp in spec.arms.items():
            start = starts[arm]
            hp = with_seed(arm_hp, seed)
            if start is not None:
                hp = started_from(hp, final_models[start])
            alike = samples_alike(spec.settings, spec.arms, arm, list(arm_paths))
            replay = [arm_paths[other].run_dir for other in alike]
            with open_run(hp, arms_root, arm, inside=base_run, replay_runs=replay) as arm_run:
                arm_paths[arm] = arm_run.paths
                run_arm(arm_run, spec.settings, use_wandb, evaluate_start=start is not None)
                final_models[arm] = arm_run.context(hp.rl.num_iterations).models
    base_rows = evaluation_rows(base_paths, BASE_RUN, 0, split, seed)
    references = reference_arm_rows(base, base_rows, split, read_likelihoods(base_paths, split))
    frames = [base_rows, references] + [
        evaluation_rows(paths, arm, it, split, seed)
        for arm, paths in arm_paths.items()
        for it in range(0 if starts[arm] else 1, spec.arms[arm].rl.num_iterations + 1)
    ]
    training = training_table(arm_paths, seed, iterations)
    return pd.concat(frames, ignore_index=True), training, timings_table(arm_paths, seed)


def started_from(hp: HyperParameters, models: dict[str, str]) -> HyperParameters:
    """`hp` with each of its agents that `models` (agent -> model) names starting from that
    model: a protocol's verifier from the model a solo arm ended with."""
    return apply_overrides(hp, start_overrides(models, make_protocol(hp).agent_names))


# Seeds side by side where nothing says otherwise and a CUDA GPU serves the models: a 135M model
# leaves one GPU mostly idle (two seeds side by side took 8.6 minutes against 7.1 for one).
AUTO_PARALLEL_SEEDS = 4


def seeds_at_once(spec: Experiment, pending: int) -> int:
    """How many of the `pending` seeds run side by side: `experiment.parallel_seeds`, or (null)
    AUTO_PARALLEL_SEEDS where a CUDA GPU serves a non-vLLM engine, else 1."""
    wanted = spec.settings.parallel_seeds
    if wanted is None:
        engine = server_engine(build_context(spec.base, BASE_RUN, 0))
        wanted = AUTO_PARALLEL_SEEDS if engine != "vllm" and has_cuda() else 1
    return max(1, min(wanted, pending))


@task(name="experiment-seed", persist_result=False)
def seed_in_worker(
    spec: Experiment,
    seed: int,
    experiment_paths: RunPaths,
    experiment_root: str,
    use_wandb: bool,
    server_url: str | None,
) -> SeedResult:
    """One seed in a worker process, its server at `server_url` (None: the configured one);
    recorded here, so a finished seed survives whatever happens to the others."""
    done = run_seed(spec, seed, experiment_root, use_wandb, server_url)
    record_seed(experiment_paths, seed, done)
    return done


@contextlib.contextmanager
def workers_reach_this_api() -> Iterator[None]:
    """Point worker processes at this flow's Prefect API (its temporary server too), so their
    task and flow runs show under this one rather than in servers of their own."""
    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    with get_client(sync_client=True) as client:
        os.environ["PREFECT_API_URL"] = str(client.api_url)
    try:
        yield
    finally:
        os.environ.pop("PREFECT_API_URL", None)


def run_seeds_side_by_side(
    spec: Experiment,
    seeds: list[int],
    experiment_paths: RunPaths,
    experiment_root: str,
    use_wandb: bool,
    at_once: int,
) -> dict[int, SeedResult]:
    """Run `seeds`, `at_once` at a time, each in a worker process with a server of its own."""
    urls = side_by_side_urls(build_context(spec.base, BASE_RUN, 0), len(seeds))
    print(f"seeds {', '.join(map(str, seeds))}: {at_once} side by side")
    with workers_reach_this_api(), ProcessPoolTaskRunner(max_workers=at_once) as runner:
        futures = {
            seed: runner.submit(
                seed_in_worker,
                parameters={
                    "spec": spec,
                    "seed": seed,
                    "experiment_paths": experiment_paths,
                    "experiment_root": experiment_root,
                    "use_wandb": use_wandb,
                    "server_url": url,
                },
            )
            for seed, url in zip(seeds, urls, strict=True)
        }
        return {seed: future.result() for seed, future in futures.items()}


def run_seeds(
    spec: Experiment,
    seeds: list[int],
    experiment_paths: RunPaths,
    experiment_root: str,
    use_wandb: bool,
) -> dict[int, SeedResult]:
    """Every seed's results: a finished seed's from its files, the others run (side by side
    where `seeds_at_once` says so). A seed whose rows lack an arm or an iteration runs again:
    its finished iterations resume from their files, so only what is new runs."""
    arm_iterations = {arm: hp.rl.num_iterations for arm, hp in spec.arms.items()}
    results = {seed: finished_seed(experiment_paths, seed, arm_iterations) for seed in seeds}
    pending = [seed for seed, done in results.items() if done is None]
    for seed in seeds:
        if results[seed] is not None:
            print(f"seed {seed}: finished earlier, reusing its rows")
    at_once = seeds_at_once(spec, len(pending))
    if at_once > 1:
        results |= run_seeds_side_by_side(
            spec, pending, experiment_paths, experiment_root, use_wandb, at_once
        )
    else:
        for seed in pending:
            results[seed] = run_seed(spec, seed, experiment_root, use_wandb)
            record_seed(experiment_paths, seed, results[seed])
    return results


@flow(name="experiment", log_prints=True)
def experiment_flow(
    overrides: list[str] | None = None,
    config: str | None = None,
    run_name: str = "experiment",
    artifacts_root: str | None = None,
    use_wandb: bool = True,
    settings: RunSettings | None = None,
) -> list[dict]:
    """Run (or resume) a learning experiment (default: the easy-grade config).

    Every seed and arm of `config`; returns the summary rows."""
    spec = resolve_experiment(config, all_overrides(settings, overrides))
    root = artifacts_root or default_root()
    experiment_paths = RunPaths.open(root, run_name)
    experiment_root = f"{root.rstrip('/')}/{run_name}"  # keeps an object store's URL scheme
    seeds = seed_list(spec.settings, spec.base.seed)
    with lock_run_folder(experiment_paths):
        results = run_seeds(spec, seeds, experiment_paths, experiment_root, use_wandb)
        summary = write_outputs_task(
            experiment_paths,
            [results[seed][0] for seed in seeds],
            pd.concat([results[seed][2] for seed in seeds], ignore_index=True),
            pd.concat([results[seed][1] for seed in seeds], ignore_index=True),
            resamples=spec.settings.bootstrap_resamples,
            seed=spec.base.seed,
            title=f"Experiment {run_name} ({spec.settings.evaluation_split} split, seeds "
            f"{', '.join(map(str, seeds))})",
        )
    return summary.to_dict("records")


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = run_folder_arguments(
        "python -m flows.experiment",
        "Run (or resume) a learning experiment: the base model and the config's arms (MALT on "
        "the verifier's own samples, DPO on label pairs, the shuffled-label control, ...) "
        "evaluated on the held-out split after every iteration, beside the reference arms, "
        "with bootstrap confidence intervals.",
        config_help=f"experiment config (default: {DEFAULT_CONFIG})",
        set_help="dotted override for every arm (or experiment.<field>=...), repeatable",
        run_name="experiment",
        run_name_help="the experiment's folder name",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    root = args.artifacts_root or default_root()

    def check():
        spec = resolve_experiment(args.config, args.overrides)
        for hp in (spec.base, *spec.arms.values()):
            check_run_providers(hp)
        if (spec.settings.parallel_seeds or 1) > 1:  # vLLM side by side: refused up front
            side_by_side_urls(build_context(spec.base, BASE_RUN, 0), 2)
        paths = RunPaths.open(root, args.run_name)
        if paths.is_local:
            check_writable(Path(paths.run_dir))
        return paths, spec

    def run(checked: tuple[RunPaths, Experiment]) -> int:
        paths, spec = checked
        configs = {"base": spec.base.to_dict()} | {a: h.to_dict() for a, h in spec.arms.items()}
        invocation = provenance.start_invocation(
            paths, provenance.collect(), arms=configs, settings=vars(spec.settings)
        )
        rows = experiment_flow(args.overrides, args.config, args.run_name, root, args.use_wandb)
        provenance.end_invocation(paths, invocation, outcome="finished")
        print(summary_text(pd.DataFrame(rows)))
        print(f"artifacts: {paths.run_dir} (experiment.html, summary.parquet, experiment.parquet)")
        return 0

    return run_command(args, check, run)


if __name__ == "__main__":
    sys.exit(main())
