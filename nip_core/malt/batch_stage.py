"""Stage `batch`: the iteration's datapoints and their episode seeds (`batch.parquet`).

Reads the train split the configuration names; writes the batch, which every later stage of the
iteration takes as its input.
"""

from __future__ import annotations

from nip_core.data import datapoints
from nip_core.data.splits import load_split
from nip_core.malt.batching import iteration_positions
from nip_core.malt.rollout_tree import BatchItem, batch_table
from nip_core.run.artifacts import RunPaths, write_parquet
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import BATCH_FILE
from nip_core.run.stages import run_stage
from nip_core.seeding import episode_seed


def select_batch(context: IterationContext) -> list[BatchItem]:
    """The iteration's `rl.rollouts_per_iteration` train datapoints, each with its episode seed."""
    hp = context.hyper_params
    points = datapoints(load_split(hp, "train"))
    batch_indices, positions = iteration_positions(
        len(points), hp.seed, context.iteration, hp.rl.rollouts_per_iteration
    )
    return [
        BatchItem(int(b), points[int(p)], episode_seed(hp.seed, context.iteration, int(b)))
        for b, p in zip(batch_indices, positions, strict=True)
    ]


def write_batch(paths: RunPaths, context: IterationContext) -> str:
    """Run (or reuse) the stage; returns the batch file it wrote."""
    out = paths.iteration_file(context.iteration, BATCH_FILE)

    def compute():
        items = select_batch(context)
        return {BATCH_FILE: write_parquet(paths.fs, out, batch_table(items))}, {
            "datapoints": len(items)
        }

    run_stage(paths, context, "batch", compute)
    return out
