"""Stage `pairs`: preference pairs per (parent node, agent) (`pairs.parquet`), from the nodes
and their expected rewards; the verifier's balanced by label when the configuration says so
(the shuffled-label control's by shown and true label)."""

from __future__ import annotations

from nip_core.data.splits import true_training_labels
from nip_core.malt.tree_values import balance_pairs_by_label, pairs_table
from nip_core.run.artifacts import RunPaths, read_parquet, write_parquet
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import PAIRS_FILE
from nip_core.run.stages import run_stage
from nip_core.seeding import stable_int


def write_pairs(paths: RunPaths, context: IterationContext, nodes: str, rewards: str) -> str:
    """Run (or reuse) the stage on the `nodes` and `rewards` files; returns the pairs file."""
    malt, seed, it = (
        context.hyper_params.pure_text_malt,
        context.hyper_params.seed,
        context.iteration,
    )
    out = paths.iteration_file(it, PAIRS_FILE)

    def compute():
        node_table = read_parquet(paths.fs, nodes)
        table = pairs_table(
            node_table,
            read_parquet(paths.fs, rewards),
            context.agent_names,
            method=malt.pair_selection_method,
            reward_midpoints=context.reward_midpoints,
            reward_ranges=context.reward_ranges,
            interval_threshold_proportion=malt.interval_threshold_proportion,
            seed=stable_int("pairs", seed, it),
            pairs_per_parent=malt.pairs_per_parent,
        )
        if malt.balance_verifier_by_label:
            table = balance_pairs_by_label(
                table,
                node_table,
                context.protocol.verifier_name,
                seed=stable_int("pair-balance", seed, it),
                spare_settled=malt.balance_spares_settled_labels,
                true_labels=control_true_labels(context.hyper_params),
            )
        return {PAIRS_FILE: write_parquet(paths.fs, out, table)}, {"pairs": table.num_rows}

    run_stage(paths, context, "pairs", compute)
    return out


def control_true_labels(hp) -> dict[object, int] | None:
    """The shuffled-label control's labels before the shuffle (its pairs are balanced on them
    too); None for every other run."""
    return true_training_labels(hp) if hp.text_rl.shuffle_training_labels else None
