"""The evaluation stage: the iteration's current models on a held-out split (`eval.parquet`).

One sample per turn on the test split (or another split, e.g. `flows.evaluate --split train`):
`iterations/<NNNN>/eval.parquet` holds one row per rollout, `eval-nodes.parquet` the full turns
(for transcripts), and the manifest stage "evaluate" the metrics. Model calls are journaled in
`eval-calls-*.jsonl`, separately from training's, so an interrupted evaluation replays them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pyarrow as pa

from nip_core.malt.batching import in_shards
from nip_core.malt.evaluation import evaluation_metrics, evaluation_table, file_stem, stage_name
from nip_core.malt.rollout_tree import BatchItem
from nip_core.play.episodes import evaluation_settings, journaled_clients, play, select_items
from nip_core.run.artifacts import RunPaths, read_parquet, write_parquet
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import (
    evaluation_shard_file,
    evaluation_shard_stem,
    nodes_file,
    table_file,
)
from nip_core.run.stages import finished_stage, run_stage


@dataclass(frozen=True)
class Evaluation:
    """What the evaluation stage gives: its metrics, and the episodes file it wrote (relative to
    the iteration folder) for the stages that read the episodes again."""

    metrics: dict
    nodes_file: str


def evaluate(
    paths: RunPaths,
    context: IterationContext,
    split: str = "test",
    progress=None,
    shard_files: list[str] | None = None,
) -> Evaluation:
    """Run (or reuse) the evaluation stage. With `shard_files` (grown by `evaluate_shard` on a
    distributed task runner) the episodes are read, not generated."""
    it, stem = context.iteration, file_stem(split)

    def compute():
        if shard_files:
            read = [read_parquet(paths.fs, paths.iteration_file(it, f)) for f in shard_files]
            nodes = pa.concat_tables(read)
        else:
            items = select_items(context, split)
            clients = journaled_clients(paths, context, stem)
            settings = evaluation_settings(context, clients, split)
            nodes = asyncio.run(play(items, settings, progress))
        table = evaluation_table(
            nodes,
            context.agent_names,
            iteration=it,
            protocol=context.protocol.name,
            split=split,
        )
        names = (nodes_file(stem), table_file(stem))
        files = {
            name: write_parquet(paths.fs, paths.iteration_file(it, name), data)
            for name, data in zip(names, (nodes, table), strict=True)
        }
        metrics = evaluation_metrics(table, context.agent_names)
        metrics["models"] = dict(context.models)
        return files, metrics

    metrics = dict(run_stage(paths, context, stage_name(split), compute)["info"])
    return Evaluation(metrics, nodes_file(stem))


def evaluation_shards(context: IterationContext, split: str) -> list[list[BatchItem]]:
    """The evaluation's episodes in shards of `text_rl.rollout_shard_size`."""
    return in_shards(select_items(context, split), context.hyper_params.text_rl.rollout_shard_size)


def evaluation_done(paths: RunPaths, context: IterationContext, split: str) -> bool:
    """Whether the evaluation stage on `split` is finished (its shards need not be played)."""
    return finished_stage(paths, context, stage_name(split)) is not None


def evaluate_shard(paths: RunPaths, context: IterationContext, split: str, shard_index: int) -> str:
    """Play one shard of the evaluation's episodes; returns its nodes file (relative). A
    finished shard (its file written whole) is reused."""
    stem = file_stem(split)
    relative = evaluation_shard_file(stem, shard_index)
    path = paths.iteration_file(context.iteration, relative)
    if paths.fs.exists(path):
        return relative
    items = evaluation_shards(context, split)[shard_index]
    clients = journaled_clients(paths, context, evaluation_shard_stem(stem, shard_index))
    settings = evaluation_settings(context, clients, split)
    write_parquet(paths.fs, path, asyncio.run(play(items, settings)))
    return relative
