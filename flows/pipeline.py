"""The stage order of one iteration, shared by `malt_iteration`, `malt_run` and `experiment`.

select-batch -> generate-rollouts -> estimate-rewards -> select-pairs -> export-datasets ->
summarise -> [evaluate, per text_rl.test_scheme] -> fine-tune -> switch-model -> switch-guard
-> publish-summary. Each task returns the artifacts it wrote and the flow hands them to the
tasks that read them (so Prefect's graph is the data flow); each stage records itself in the
iteration's manifest, so rerunning skips finished stages. `iteration_subflow` is the same as a
Prefect subflow, so a multi-iteration run shows one flow run per iteration in the UI.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect import flow
from prefect.futures import PrefectFuture

from flows.cli import OpenRun, make_task_runner
from nip_core.malt.evaluation import format_metrics, should_evaluate
from nip_core.play.evaluation_stage import evaluation_done, evaluation_shards
from nip_core.play.rollout_stage import pending_shards, record_shard
from nip_core.run.artifacts import RunPaths, read_json
from nip_core.run.iteration_context import IterationContext
from nip_core.run.stages import record_server_restarts, stage_seconds
from nip_core.run.tracking import Tracker, log_iteration
from nip_core.training.fine_tune_stage import earlier_exports
from tasks.batch import select_batch_task
from tasks.evaluate import evaluate_shard_task, evaluate_task
from tasks.export import export_datasets_task
from tasks.fine_tune import fine_tune_task, switch_model_task
from tasks.pairs import select_pairs_task
from tasks.publish_summary import publish_summary_task
from tasks.rewards import estimate_rewards_task
from tasks.rollouts import generate_rollouts_task, grow_shard_task
from tasks.summary import summarise_iteration_task
from tasks.switch_guard import score_previous_models_task, switch_guard_task

log = logging.getLogger(__name__)


def run_iteration_stages(
    paths: RunPaths,
    context: IterationContext,
    tracker: Tracker | None = None,
    distributed: bool = False,
) -> dict:
    """All stages of one iteration; the caller holds the run folder (`flows.cli.open_run`: the
    lock, and the self-hosted server when the run needs one). `distributed`: grow the rollout
    shards as tasks of the flow's task runner (Dask, Ray) first."""
    batch = select_batch_task(paths, context)
    # The guard's scoring of the models this iteration starts from, played while the rollouts
    # ask the same models (the server batches both): the guard then replays it.
    previous_scoring = score_previous_models_task.submit(paths, context)
    if distributed:
        grow_shards_on_task_runner(paths, context, batch)
    nodes = generate_rollouts_task(paths, context, batch)
    rewards = estimate_rewards_task(paths, context, nodes)
    pairs = None if context.is_ei_iteration else select_pairs_task(paths, context, nodes, rewards)
    datasets = export_datasets_task(paths, context, batch, nodes, rewards, pairs)
    stats = summarise_iteration_task(paths, context, nodes, rewards, pairs)
    hp = context.hyper_params
    if should_evaluate(hp.text_rl.test_scheme, context.iteration, hp.rl.num_iterations):
        shards = evaluate_shards_on_task_runner(paths, context) if distributed else None
        stats["eval"] = evaluate_task(paths, context, shard_files=shards).metrics
    if tracker is not None:
        log_iteration(tracker, stats, context.iteration)
    earlier = (
        earlier_exports(paths, context) if hp.text_rl.fine_tune_on_all_previous_rollouts else {}
    )
    jobs = fine_tune_task(paths, context, datasets, earlier)
    candidates = switch_model_task(paths, context, jobs)
    await_previous_scoring(previous_scoring)
    stats["models_after"] = switch_guard_task(paths, context, candidates)
    publish_summary_task(paths, context, stats)
    return stats


def await_previous_scoring(future: PrefectFuture) -> None:
    """Wait for the guard's scoring played ahead; where it failed, say so: the guard plays the
    calls its journal lacks itself."""
    future.wait()
    if future.state.is_failed():
        log.warning(
            "the switch guard's scoring of the previous models, played beside the rollouts, "
            "failed (%s): the guard plays it itself",
            future.state.message,
        )


def evaluate_shards_on_task_runner(
    paths: RunPaths, context: IterationContext, split: str = "test"
) -> list[str] | None:
    """Play the evaluation's shards as tasks of the flow's task runner (None: already done)."""
    if evaluation_done(paths, context, split):
        return None
    count = len(evaluation_shards(context, split))
    futures = [evaluate_shard_task.submit(paths, context, split, i) for i in range(count)]
    return [future.result() for future in futures]


def grow_shards_on_task_runner(paths: RunPaths, context: IterationContext, batch: str) -> None:
    """Submit every unfinished rollout shard of `batch` to the flow's task runner; record each
    as it ends."""
    pending = pending_shards(paths, context, batch)
    futures = [grow_shard_task.submit(paths, context, batch, i) for i in pending]
    for future in futures:
        record_shard(paths, context, future.result())


@flow(
    name="iteration",
    flow_run_name="{context.run_name}-iteration-{context.iteration}",
    validate_parameters=False,
    log_prints=True,
)
def iteration_subflow(
    paths: Any, context: Any, tracker: Any = None, distributed: bool = False
) -> dict:
    """`run_iteration_stages` as a subflow: one flow run per iteration in the Prefect UI.
    (Typed `Any`: Prefect builds a parameter schema from annotations, and a tracker is no
    pydantic type.)"""
    return run_iteration_stages(paths, context, tracker, distributed)


def run_iteration(
    run: OpenRun, iteration: int, tracker: Tracker | None = None, *, as_subflow: bool = False
) -> dict:
    """One iteration of an open run: in this flow run (the default), or as a subflow whose task
    runner grows the rollout shards (the run's `task_runner` "dask" or "ray")."""
    context = run.context(iteration)
    restarts_before = len(server_restarts(run))
    try:
        distributed = run.task_runner != "thread"
        if not distributed and not as_subflow:
            return run_iteration_stages(run.paths, context, tracker)
        subflow = iteration_subflow
        if distributed:
            runner = make_task_runner(run.task_runner, run.task_runner_address)
            subflow = iteration_subflow.with_options(task_runner=runner)
        return subflow(run.paths, context, tracker, distributed)
    finally:
        record_server_restarts(run.paths, context, server_restarts(run)[restarts_before:])


def server_restarts(run: OpenRun) -> list[dict]:
    """Restarts of the run's own server so far (none for a server it does not supervise)."""
    return list(getattr(run.server, "restarts", []))


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
    if paths.fs.exists(paths.manifest(context.iteration)):
        seconds = stage_seconds(read_json(paths.fs, paths.manifest(context.iteration)))
        timings = ", ".join(f"{stage} {value:.1f}" for stage, value in seconds.items())
        lines.append(f"  seconds per stage: {timings or 'n/a'}")
    return "\n".join(lines)
