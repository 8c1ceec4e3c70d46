"""Stage: evaluate the iteration's current models on a held-out split (`eval.parquet`).

One sample per turn on the test split (or the train split for `flows.evaluate --split train`):
`iterations/<NNNN>/eval.parquet` holds one row per rollout, `eval-nodes.parquet` the full turns
(for transcripts), and the manifest stage "evaluate" the metrics. Model calls are journaled in
`eval-calls-*.jsonl`, separately from training's, so an interrupted evaluation replays them.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pyarrow as pa
from prefect import get_run_logger, task

from nip_core.agents.call_journal import JournaledClient
from nip_core.agents.clients import close_clients
from nip_core.data import datapoints
from nip_core.data.splits import load_split
from nip_core.malt.batching import in_shards
from nip_core.malt.evaluation import (
    evaluation_items,
    evaluation_metrics,
    evaluation_seed,
    evaluation_size,
    evaluation_table,
    file_stem,
    format_metrics,
    stage_name,
)
from nip_core.malt.rollout_tree import BatchItem, RolloutSettings, grow_trees
from nip_core.run.artifacts import (
    RunPaths,
    read_parquet,
    write_parquet,
)
from nip_core.run.iteration_context import IterationContext
from nip_core.run.stages import finished_stage, run_stage
from tasks import TRANSIENT_RETRY
from tasks.prefect_artifacts import rollout_progress
from tasks.rollouts import chat_clients, rollout_settings


def select_items(context: IterationContext, split: str) -> list[BatchItem]:
    hp = context.hyper_params
    points = datapoints(load_split(hp, split))
    count = evaluation_size(
        len(points),
        whole_dataset=hp.text_rl.test_on_whole_dataset,
        rollouts_per_iteration=hp.rl.rollouts_per_iteration,
        num_test_iterations=hp.rl.num_test_iterations,
    )
    return evaluation_items(points, count, hp.seed, split)


def journaled_clients(paths: RunPaths, context: IterationContext, stem: str) -> dict:
    """The training clients (one per endpoint), each journaling to `<stem>-calls-<i>.jsonl` in
    the iteration's folder."""
    plain = chat_clients(context, None)
    wrapped: dict[int, JournaledClient] = {}
    for client in plain.values():
        if id(client) not in wrapped:
            path = paths.iteration_file(context.iteration, f"{stem}-calls-{len(wrapped)}.jsonl")
            wrapped[id(client)] = JournaledClient(client, path, paths.fs)
    return {agent: wrapped[id(client)] for agent, client in plain.items()}


def evaluation_settings(context: IterationContext, clients: dict, split: str) -> RolloutSettings:
    """Training's settings with one response per turn and evaluation-specific call seeds.

    Call seeds ignore the iteration (common random numbers): every evaluation of a run asks each
    prompt with the same seed, so a model that did not change answers exactly as before, and
    differences between iterations come from the models alone.
    """
    return dataclasses.replace(
        rollout_settings(context, clients),
        num_responses_per_timestep=1,
        run_seed=evaluation_seed(context.hyper_params.seed, split),
        iteration=0,
    )


async def _grow_then_close(items, settings, progress):
    try:
        return await grow_trees(items, settings, progress)
    finally:
        await close_clients(settings.clients.values())


def evaluate(
    paths: RunPaths,
    context: IterationContext,
    split: str = "test",
    progress=None,
    shard_files: list[str] | None = None,
) -> dict:
    """Run (or reuse) the evaluation stage; returns its metrics. With `shard_files` (grown by
    `evaluate_shard_task` on a distributed task runner) the episodes are read, not generated."""
    it, stem = context.iteration, file_stem(split)

    def compute():
        if shard_files:
            read = [read_parquet(paths.fs, paths.iteration_file(it, f)) for f in shard_files]
            nodes = pa.concat_tables(read)
        else:
            items = select_items(context, split)
            clients = journaled_clients(paths, context, stem)
            settings = evaluation_settings(context, clients, split)
            nodes = asyncio.run(_grow_then_close(items, settings, progress))
        table = evaluation_table(
            nodes,
            context.agent_names,
            iteration=it,
            protocol=context.protocol.name,
            split=split,
        )
        files = {
            f"{stem}-nodes.parquet": write_parquet(
                paths.fs, paths.iteration_file(it, f"{stem}-nodes.parquet"), nodes
            ),
            f"{stem}.parquet": write_parquet(
                paths.fs, paths.iteration_file(it, f"{stem}.parquet"), table
            ),
        }
        metrics = evaluation_metrics(table, context.agent_names)
        metrics["models"] = dict(context.models)
        return files, metrics

    return dict(run_stage(paths, context, stage_name(split), compute)["info"])


def evaluation_progress(context: IterationContext, split: str):
    """Terminal bar and Prefect progress artifact of the evaluation's generation."""
    return rollout_progress(context, what=f"{split} evaluation", artifact_name=file_stem(split))


# Model calls touch the network: a transient failure retries the stage, and the call journal
# replays every call that had finished, so none is paid for twice.
@task(
    name="evaluate",
    **TRANSIENT_RETRY,
)
def evaluate_task(
    paths: RunPaths,
    context: IterationContext,
    split: str = "test",
    shard_files: list[str] | None = None,
) -> dict:
    with evaluation_progress(context, split) as progress:
        metrics = evaluate(paths, context, split, progress, shard_files)
    get_run_logger().info("iteration %d %s", context.iteration, format_metrics(metrics))
    return metrics


# ---- evaluation shards as tasks of their own, for a distributed task runner ---------------------


def evaluation_shards(context: IterationContext, split: str) -> list[list[BatchItem]]:
    """The evaluation's episodes in shards of `text_rl.rollout_shard_size`."""
    return in_shards(select_items(context, split), context.hyper_params.text_rl.rollout_shard_size)


def evaluation_done(paths: RunPaths, context: IterationContext, split: str) -> bool:
    return finished_stage(paths, context, stage_name(split)) is not None


@task(name="evaluate-shard", task_run_name="evaluate-shard-{shard_index}", **TRANSIENT_RETRY)
def evaluate_shard_task(
    paths: RunPaths, context: IterationContext, split: str, shard_index: int
) -> str:
    """Play one shard of the evaluation's episodes wherever the task runner puts this task;
    returns its nodes file (relative). A finished shard (its file written whole) is reused."""
    stem = file_stem(split)
    relative = f"{stem}-shards/nodes-{shard_index:05d}.parquet"
    path = paths.iteration_file(context.iteration, relative)
    if paths.fs.exists(path):
        return relative
    items = evaluation_shards(context, split)[shard_index]
    clients = journaled_clients(paths, context, f"{stem}-shard-{shard_index:05d}")
    settings = evaluation_settings(context, clients, split)
    write_parquet(paths.fs, path, asyncio.run(_grow_then_close(items, settings, None)))
    return relative
