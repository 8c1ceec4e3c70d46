"""Stage `rewards`: every node's expected reward for every agent (`rewards.parquet`), from the
rollout stage's nodes."""

from __future__ import annotations

from nip_core.malt.tree_values import rewards_table
from nip_core.run.artifacts import RunPaths, read_parquet, write_parquet
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import REWARDS_FILE
from nip_core.run.stages import run_stage


def estimate_rewards(paths: RunPaths, context: IterationContext, nodes: str) -> str:
    """Run (or reuse) the stage on the `nodes` file; returns the rewards file it wrote."""
    out = paths.iteration_file(context.iteration, REWARDS_FILE)

    def compute():
        table = rewards_table(
            read_parquet(paths.fs, nodes),
            context.agent_names,
            context.reward_midpoints,
            context.hyper_params.pure_text_malt.expected_reward_estimator,
        )
        return {REWARDS_FILE: write_parquet(paths.fs, out, table)}, {"rows": table.num_rows}

    run_stage(paths, context, "rewards", compute)
    return out
