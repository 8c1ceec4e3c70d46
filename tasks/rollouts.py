"""Stage: grow the response trees (`shards/nodes-*.parquet`, then `nodes.parquet`).

Datapoints are split into shards of `text_rl.rollout_shard_size`; all shards grow together (so
every call of a tree level is in flight at once) and each shard is checkpointed as soon as it is
complete. Every finished model call is also journaled (`calls.jsonl`), so after a crash the
rerun replays them instead of calling the model again.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pyarrow as pa
from prefect import task

from nip_core.agents import make_chat_client
from nip_core.agents.call_journal import JournaledClient
from nip_core.agents.clients import close_clients
from nip_core.malt.rollout_tree import RolloutSettings, batch_items, grow_trees
from nip_core.run.artifacts import (
    RunPaths,
    load_manifest,
    read_parquet,
    stage_is_done,
    write_parquet,
)
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import BATCH_FILE, CALL_JOURNAL_FILE, NODES_FILE
from nip_core.run.stages import run_stage
from tasks import TRANSIENT_RETRY
from tasks.prefect_artifacts import rollout_progress

log = logging.getLogger(__name__)


def chat_clients(context: IterationContext, journal: Path | None) -> dict[str, object]:
    """One client per distinct endpoint, shared by the agents that use it."""
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
                client = JournaledClient(
                    client, journal.with_name(f"calls-{len(by_endpoint)}.jsonl")
                )
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


async def _grow_shards(paths, context, settings, shards, progress) -> None:
    config_hash = context.hyper_params.config_hash()

    async def one(shard_index: int, items) -> None:
        stage = f"rollouts/shard-{shard_index:05d}"
        relative = f"shards/nodes-{shard_index:05d}.parquet"
        manifest = load_manifest(paths, context.iteration, context.run_name, config_hash)
        if stage_is_done(paths, context.iteration, manifest, stage):
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
    hp = context.hyper_params
    items = batch_items(read_parquet(paths.fs, paths.iteration_file(context.iteration, BATCH_FILE)))
    size = hp.text_rl.rollout_shard_size
    shards = [items[i : i + size] for i in range(0, len(items), size)]
    journal = (
        Path(paths.iteration_file(context.iteration, CALL_JOURNAL_FILE)) if paths.is_local else None
    )

    def compute():
        clients = chat_clients(context, journal)
        settings = rollout_settings(context, clients)
        asyncio.run(_grow_shards(paths, context, settings, shards, progress))
        tables = [
            read_parquet(
                paths.fs, paths.iteration_file(context.iteration, f"shards/nodes-{i:05d}.parquet")
            )
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
