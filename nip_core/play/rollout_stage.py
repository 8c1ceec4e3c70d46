"""The rollout stage: grow the response trees (`shards/nodes-*.parquet`, then `nodes.parquet`).

Datapoints are split into shards of `text_rl.rollout_shard_size`; all shards grow together (so
every call of a tree level is in flight at once) and each shard is checkpointed as soon as it is
complete. Every finished model call is also journaled (`calls-*.jsonl`), so after a crash the
rerun replays them instead of calling the model again. On a distributed task runner each shard
is a task of its own (`grow_shard`), recorded by the flow (`record_shard`).
"""

from __future__ import annotations

import asyncio

import pyarrow as pa

from nip_core.agents.clients import close_clients
from nip_core.malt.batching import in_shards
from nip_core.malt.rollout_tree import batch_items, grow_trees
from nip_core.play.episodes import chat_clients, play, replayed_calls, rollout_settings
from nip_core.run.artifacts import RunPaths, read_parquet, write_parquet
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import (
    CALL_JOURNAL_FILE,
    NODES_FILE,
    journal_part,
    rollout_shard_file,
    shard_call_journal,
)
from nip_core.run.stages import finished_stage, run_stage


def shard_stage(shard_index: int) -> str:
    """The manifest stage of one shard: `rollouts/shard-<NNNNN>`."""
    return f"rollouts/shard-{shard_index:05d}"


def batch_shards(paths: RunPaths, context: IterationContext, batch: str) -> list[list]:
    """The items of the `batch` file in shards of `text_rl.rollout_shard_size`."""
    items = batch_items(read_parquet(paths.fs, batch))
    return in_shards(items, context.hyper_params.text_rl.rollout_shard_size)


def journaled_by(paths: RunPaths, context: IterationContext, journal: str):
    """Clients journaling to the parts of `journal` (a file of the iteration's folder), and in
    the first iteration replaying the rollout calls of `paths.replay_runs`."""
    path = paths.iteration_file(context.iteration, journal)
    return chat_clients(
        context,
        lambda endpoint: journal_part(path, endpoint),
        paths.fs,
        lambda endpoint: sibling_journals(paths, endpoint) if context.iteration == 0 else [],
    )


def sibling_journals(paths: RunPaths, endpoint: int) -> list[str]:
    """Endpoint `endpoint`'s rollout call journals of the first iteration of each of
    `paths.replay_runs`: the stage's own (`calls-<i>.jsonl`) and its shards'
    (`calls-shard-<n>-<i>.jsonl`). A call replays only where everything its answer depends on
    is the same (`call_key`): the same model, prompt, sampling settings and call seed."""
    found = []
    for run_dir in paths.replay_runs:
        folder = RunPaths(paths.fs, run_dir).iteration_dir(0)
        found.append(journal_part(f"{folder}/{CALL_JOURNAL_FILE}", endpoint))
        shards = paths.fs.glob(f"{folder}/{journal_part('calls-shard-*.jsonl', endpoint)}*")
        found += sorted({shard.removesuffix(".d") for shard in shards})
    return found


async def _grow_shards(paths, context, settings, shards, progress) -> None:
    """Grow the unfinished shards together.

    Each shard is checkpointed by a worker thread as soon as it is complete, one at a time (the
    manifest is read, changed and written whole), so the event loop goes on serving the other
    shards' calls meanwhile.
    """
    manifest_lock = asyncio.Lock()

    async def one(shard_index: int, items) -> None:
        stage, relative = shard_stage(shard_index), rollout_shard_file(shard_index)
        if finished_stage(paths, context, stage) is not None:
            return
        table = await grow_trees(items, settings, progress)

        def compute():
            path = paths.iteration_file(context.iteration, relative)
            return {relative: write_parquet(paths.fs, path, table)}, {"nodes": table.num_rows}

        async with manifest_lock:
            await asyncio.to_thread(run_stage, paths, context, stage, compute)

    try:
        await asyncio.gather(*(one(i, items) for i, items in enumerate(shards)))
    finally:
        await close_clients(settings.clients.values())


def grow_all_trees(paths: RunPaths, context: IterationContext, batch: str, progress=None) -> str:
    """Run (or reuse) the stage "rollouts" on the `batch` file: every shard, then their union;
    returns the nodes file."""
    shards = batch_shards(paths, context, batch)
    out = paths.iteration_file(context.iteration, NODES_FILE)

    def compute():
        clients = journaled_by(paths, context, CALL_JOURNAL_FILE)
        settings = rollout_settings(context, clients)
        asyncio.run(_grow_shards(paths, context, settings, shards, progress))
        # Read back even the shards grown here: nodes.parquet is then byte for byte the same
        # whether the run was resumed or not.
        tables = [
            read_parquet(paths.fs, paths.iteration_file(context.iteration, rollout_shard_file(i)))
            for i in range(len(shards))
        ]
        nodes = pa.concat_tables(tables)
        return {NODES_FILE: write_parquet(paths.fs, out, nodes)}, {
            "nodes": nodes.num_rows,
            "shards": len(shards),
            "replayed_calls": replayed_calls(clients),
        }

    run_stage(paths, context, "rollouts", compute)
    return out


def pending_shards(paths: RunPaths, context: IterationContext, batch: str) -> list[int]:
    """Shards of the `batch` file whose stage is not finished yet."""
    count = len(batch_shards(paths, context, batch))
    return [i for i in range(count) if finished_stage(paths, context, shard_stage(i)) is None]


def grow_shard(paths: RunPaths, context: IterationContext, batch: str, shard_index: int) -> dict:
    """Grow one shard of the `batch` file's trees; returns its stage and files for
    `record_shard`.

    Writes only the shard's own files (its nodes and its call journal, `calls-shard-<i>.jsonl`),
    so workers on several machines never write the manifest at once.
    """
    items = batch_shards(paths, context, batch)[shard_index]
    clients = journaled_by(paths, context, shard_call_journal(shard_index))
    table = asyncio.run(play(items, rollout_settings(context, clients)))
    relative = rollout_shard_file(shard_index)
    digest = write_parquet(paths.fs, paths.iteration_file(context.iteration, relative), table)
    return {"stage": shard_stage(shard_index), "files": {relative: digest}, "nodes": table.num_rows}


def record_shard(paths: RunPaths, context: IterationContext, shard: dict) -> None:
    """Record a shard grown by `grow_shard` (in the flow's process, one at a time)."""
    run_stage(paths, context, shard["stage"], lambda: (shard["files"], {"nodes": shard["nodes"]}))
