"""Stage: expected reward of every node for every agent (`rewards.parquet`)."""

from __future__ import annotations

from prefect import task

from nip_core.malt.tree_values import rewards_table
from nip_core.run.artifacts import RunPaths, read_parquet, write_parquet
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import NODES_FILE, REWARDS_FILE
from nip_core.run.stages import run_stage


def estimate_rewards(paths: RunPaths, context: IterationContext) -> dict:
    def compute():
        nodes = read_parquet(paths.fs, paths.iteration_file(context.iteration, NODES_FILE))
        table = rewards_table(
            nodes,
            context.agent_names,
            context.reward_midpoints,
            context.hyper_params.pure_text_malt.expected_reward_estimator,
        )
        path = paths.iteration_file(context.iteration, REWARDS_FILE)
        return {REWARDS_FILE: write_parquet(paths.fs, path, table)}, {"rows": table.num_rows}

    return run_stage(paths, context, "rewards", compute)


@task(name="estimate-rewards")
def estimate_rewards_task(paths: RunPaths, context: IterationContext) -> str:
    estimate_rewards(paths, context)
    return paths.iteration_file(context.iteration, REWARDS_FILE)
