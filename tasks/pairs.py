"""Stage: preference pairs per (parent node, agent) (`pairs.parquet`)."""

from __future__ import annotations

from prefect import task

from nip_core.malt.tree_values import balance_pairs_by_label, pairs_table
from nip_core.run.artifacts import RunPaths, read_parquet, write_parquet
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import NODES_FILE, PAIRS_FILE, REWARDS_FILE
from nip_core.run.stages import run_stage
from nip_core.seeding import stable_int


def run_pair_selection(paths: RunPaths, context: IterationContext) -> dict:
    malt = context.hyper_params.pure_text_malt

    def compute():
        nodes = read_parquet(paths.fs, paths.iteration_file(context.iteration, NODES_FILE))
        rewards = read_parquet(paths.fs, paths.iteration_file(context.iteration, REWARDS_FILE))
        table = pairs_table(
            nodes,
            rewards,
            context.agent_names,
            method=malt.pair_selection_method,
            reward_midpoints=context.reward_midpoints,
            reward_ranges=context.reward_ranges,
            interval_threshold_proportion=malt.interval_threshold_proportion,
            seed=stable_int("pairs", context.hyper_params.seed, context.iteration),
            pairs_per_parent=malt.pairs_per_parent,
        )
        if malt.balance_verifier_by_label:
            table = balance_pairs_by_label(
                table,
                nodes,
                context.protocol.verifier_name,
                seed=stable_int("pair-balance", context.hyper_params.seed, context.iteration),
            )
        path = paths.iteration_file(context.iteration, PAIRS_FILE)
        return {PAIRS_FILE: write_parquet(paths.fs, path, table)}, {"pairs": table.num_rows}

    return run_stage(paths, context, "pairs", compute)


@task(name="select-pairs")
def select_pairs_task(paths: RunPaths, context: IterationContext) -> str:
    run_pair_selection(paths, context)
    return paths.iteration_file(context.iteration, PAIRS_FILE)
