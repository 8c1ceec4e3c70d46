"""Stage: grow the response trees (`shards/nodes-*.parquet`, then `nodes.parquet`).

Datapoints are split into shards of `text_rl.rollout_shard_size`; all shards grow together (so
every call of a tree level is in flight at once) and each shard is checkpointed as soon as it is
complete. Every finished model call is also journaled (`calls.jsonl`), so after a crash the
rerun replays them instead of calling the model again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pyarrow as pa
from prefect import task

from nip_core.agents import make_chat_client
from nip_core.agents.call_journal import JournaledClient
from nip_core.agents.clients import close_clients
from nip_core.malt.batching import in_shards
from nip_core.malt.rollout_tree import RolloutSettings, batch_items, grow_trees
from nip_core.run.artifacts import (
    RunPaths,
    read_parquet,
    write_parquet,
)
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import BATCH_FILE, CALL_JOURNAL_FILE, NODES_FILE
from nip_core.run.stages import finished_stage, run_stage
from tasks import TRANSIENT_RETRY
from tasks.prefect_artifacts import rollout_progress

log = logging.getLogger(__name__)


def chat_clients(
    context: IterationContext, journal: str | None, fs: Any = None
) -> dict[str, object]:
    """One client per distinct endpoint, shared by the agents that use it; with `journal`
    (`<folder>/<stem>.jsonl` on `fs`), each journals to `<stem>-<i>.jsonl`."""
    hp = context.hyper_params
    by_endpoint: dict[tuple, object] = {}
    clients = {}
    for agent, params in context.agent_params.items():
        key = (
            params.use_dummy_api,
            params.model_provider,
            params.language_model_server_scheme_host,
            params.language_model_server_port,
            params.request_timeout_seconds,
            tuple(params.model_server_replicas or ()),
        )
        if key not in by_endpoint:
            client = make_chat_client(
                params, max_concurrency=hp.text_rl.max_concurrent_requests, dummy_seed=hp.seed
            )
            if journal is not None:
                numbered = f"{journal.removesuffix('.jsonl')}-{len(by_endpoint)}.jsonl"
                client = JournaledClient(client, numbered, fs)
            by_endpoint[key] = client
        clients[agent] = by_endpoint[key]
    return clients


def rollout_settings(context: IterationContext, clients: dict[str, object]) -> RolloutSettings:
    hp = context.hyper_params
    return RolloutSettings(
        protocol=context.protocol,
        agent_params=context.agent_params,
        models=context.models,
        clients=clients,
        frozen_agents=context.frozen_agents,
        num_responses_per_timestep=context.num_responses_per_timestep,
        frozen_agents_generate_one_response=hp.pure_text_malt.frozen_agents_generate_one_response,
        run_seed=hp.seed,
        iteration=context.iteration,
        max_concurrent_requests=hp.text_rl.max_concurrent_requests,
    )


def shard_stage(shard_index: int) -> str:
    return f"rollouts/shard-{shard_index:05d}"


def shard_file(shard_index: int) -> str:
    return f"shards/nodes-{shard_index:05d}.parquet"


def batch_shards(paths: RunPaths, context: IterationContext) -> list[list]:
    """The iteration's batch items in shards of `text_rl.rollout_shard_size`."""
    items = batch_items(read_parquet(paths.fs, paths.iteration_file(context.iteration, BATCH_FILE)))
    return in_shards(items, context.hyper_params.text_rl.rollout_shard_size)


async def _grow_shards(paths, context, settings, shards, progress) -> None:
    async def one(shard_index: int, items) -> None:
        stage, relative = shard_stage(shard_index), shard_file(shard_index)
        if finished_stage(paths, context, stage) is not None:
            return
        table = await grow_trees(items, settings, progress)

        def compute():
            path = paths.iteration_file(context.iteration, relative)
            return {relative: write_parquet(paths.fs, path, table)}, {"nodes": table.num_rows}

        run_stage(paths, context, stage, compute)

    try:
        await asyncio.gather(*(one(i, items) for i, items in enumerate(shards)))
    finally:
        await close_clients(settings.clients.values())


def grow_all_trees(paths: RunPaths, context: IterationContext, progress=None) -> dict:
    shards = batch_shards(paths, context)
    journal = paths.iteration_file(context.iteration, CALL_JOURNAL_FILE)

    def compute():
        clients = chat_clients(context, journal, paths.fs)
        settings = rollout_settings(context, clients)
        asyncio.run(_grow_shards(paths, context, settings, shards, progress))
        tables = [
            read_parquet(paths.fs, paths.iteration_file(context.iteration, shard_file(i)))
            for i in range(len(shards))
        ]
        nodes = pa.concat_tables(tables)
        digest = write_parquet(paths.fs, paths.iteration_file(context.iteration, NODES_FILE), nodes)
        replayed = sum(
            c.replayed
            for c in {id(c): c for c in clients.values()}.values()
            if isinstance(c, JournaledClient)
        )
        return {NODES_FILE: digest}, {
            "nodes": nodes.num_rows,
            "shards": len(shards),
            "replayed_calls": replayed,
        }

    return run_stage(paths, context, "rollouts", compute)


# Model calls touch the network: a transient failure retries the stage, which resumes from the
# finished shards and the call journal, so no completed call is paid for twice.
@task(
    name="generate-rollouts",
    **TRANSIENT_RETRY,
)
def generate_rollouts_task(paths: RunPaths, context: IterationContext) -> str:
    with rollout_progress(context) as progress:
        grow_all_trees(paths, context, progress=progress)
    return paths.iteration_file(context.iteration, NODES_FILE)


# ---- shards as tasks of their own, for a distributed task runner (Dask, Ray) -------------------


def pending_shards(paths: RunPaths, context: IterationContext) -> list[int]:
    """Shards whose stage is not finished yet."""
    count = len(batch_shards(paths, context))
    return [i for i in range(count) if finished_stage(paths, context, shard_stage(i)) is None]


@task(name="grow-shard", task_run_name="grow-shard-{shard_index}", **TRANSIENT_RETRY)
def grow_shard_task(paths: RunPaths, context: IterationContext, shard_index: int) -> dict:
    """Grow one shard's trees wherever the task runner puts this task; returns its files.

    Writes only the shard's own files (its nodes and its call journal, `calls-shard-<i>.jsonl`);
    the flow records the stage in the manifest, so workers never write the manifest at once.
    """
    items = batch_shards(paths, context)[shard_index]
    journal = paths.iteration_file(context.iteration, f"calls-shard-{shard_index:05d}.jsonl")
    clients = chat_clients(context, journal, paths.fs)
    settings = rollout_settings(context, clients)

    async def grow():
        try:
            return await grow_trees(items, settings)
        finally:
            await close_clients(settings.clients.values())

    table = asyncio.run(grow())
    relative = shard_file(shard_index)
    digest = write_parquet(paths.fs, paths.iteration_file(context.iteration, relative), table)
    return {"stage": shard_stage(shard_index), "files": {relative: digest}, "nodes": table.num_rows}


def record_shard(paths: RunPaths, context: IterationContext, shard: dict) -> None:
    """Record a shard grown by `grow_shard_task` (in the flow's process, one at a time)."""
    run_stage(paths, context, shard["stage"], lambda: (shard["files"], {"nodes": shard["nodes"]}))
