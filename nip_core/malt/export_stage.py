"""Stage `export`: each trainable group's training dataset (`datasets/{dpo,kto,sft}/<group>.parquet`
and the `.jsonl` beside it), from the batch, the nodes, their rewards and the pairs.

MALT iterations export DPO rows (what the verifier's rows hold: `verifier_rows`), or with
`training_objective: kto` the group's sampled replies marked against their siblings; expert
iterations (`pure_text_ei`, or the first `num_initial_ei_iterations` of MALT) export SFT rows
of the rewarded rollouts. Frozen groups get no dataset.
"""

from __future__ import annotations

import pyarrow as pa

from nip_core.malt import dataset_export as export
from nip_core.malt import verifier_rows
from nip_core.malt.group_relative import marked_replies_table
from nip_core.malt.pairs_stage import control_true_labels
from nip_core.malt.rollout_tree import batch_items
from nip_core.malt.tree_values import balance_pairs_by_label
from nip_core.run.artifacts import RunPaths, jsonl_bytes, read_parquet, write_bytes, write_parquet
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import dataset_file
from nip_core.run.stages import run_stage
from nip_core.seeding import stable_int


def group_dataset(
    context: IterationContext,
    ctx: export.ExportContext,
    agents: tuple[str, ...],
    nodes: pa.Table,
    rewards: pa.Table,
    pairs: pa.Table | None,
) -> tuple[str, pa.Table, list[dict]]:
    """(kind, Parquet table, OpenAI JSONL records) of one trainable group's dataset: in an
    expert iteration SFT rows of its agents' rewarded rollouts (the verifier's balanced by label
    when asked), else DPO rows of their preference pairs (the verifier's from the signal its
    configuration names). Rows keep the exported order, verdicts alternating, unless the agents
    shuffle their training data."""
    hp = context.hyper_params
    keep_order = not context.agent_params[agents[0]].shuffle_training_data
    if context.is_ei_iteration:
        rows = export.sft_rows(
            nodes, rewards, ctx, agents, context.agent_names, hp.pure_text_ei, hp.text_rl, hp.seed
        )
        if hp.pure_text_malt.balance_verifier_by_label:
            rows = verifier_rows.balance_verifier_rollouts(
                rows,
                context.protocol.verifier_name,
                {item.datapoint.id: item.datapoint.y for item in ctx.items.values()},
                stable_int("sft-balance", hp.seed, context.iteration),
            )
        rows = export.alternate_verdicts(rows, "messages") if keep_order else rows
        return "sft", export.sft_table(rows), export.sft_openai_jsonl(rows)
    if hp.pure_text_malt.training_objective == "kto":
        rows = export.kto_rows(nodes, group_marked_replies(context, nodes, rewards, agents), ctx)
        rows = export.alternate_verdicts(rows, "completion") if keep_order else rows
        return "kto", export.kto_table(rows), export.kto_openai_jsonl(rows)
    rows = verifier_rows.verifier_signal_rows(
        nodes, pairs, ctx, agents, hp.pure_text_malt, hp.text_rl, hp.seed
    )
    rows = export.alternate_verdicts(rows, "chosen") if keep_order else rows
    return "dpo", export.dpo_table(rows), export.dpo_openai_jsonl(rows)


def group_marked_replies(
    context: IterationContext, nodes: pa.Table, rewards: pa.Table, agents: tuple[str, ...]
) -> pa.Table:
    """The group's agents' replies marked against their siblings (KTO's rows), the verifier's
    balanced by the code's label when the configuration says so."""
    hp, it = context.hyper_params, context.iteration
    malt = hp.pure_text_malt
    table = marked_replies_table(
        nodes,
        rewards,
        context.agent_names,
        malt.kto_rows_per_parent,
        stable_int("kto", hp.seed, it),
    )
    table = table.filter(pa.array([agent in agents for agent in table.column("agent").to_pylist()]))
    if not malt.balance_verifier_by_label:
        return table
    seed = stable_int("kto-balance", hp.seed, it)
    verifier, spare = context.protocol.verifier_name, malt.balance_spares_settled_labels
    truth = control_true_labels(hp)
    return balance_pairs_by_label(table, nodes, verifier, seed, spare, true_labels=truth)


def export_datasets(
    paths: RunPaths,
    context: IterationContext,
    batch: str,
    nodes: str,
    rewards: str,
    pairs: str | None,
) -> dict[str, dict]:
    """Run (or reuse) the stage on the `batch`, `nodes`, `rewards` and `pairs` files (None: an
    expert iteration); returns, per group, its dataset's kind, rows and files (relative)."""
    it = context.iteration
    if pairs is None and not context.is_ei_iteration:
        raise ValueError(f"iteration {it} is a MALT iteration: its export needs the pairs file")

    def compute():
        read = lambda path: read_parquet(paths.fs, path)  # noqa: E731
        node_table, reward_table = read(nodes), read(rewards)
        items = {item.batch_index: item for item in batch_items(read(batch))}
        ctx = export.ExportContext(context.protocol, context.agent_params, items, it)
        pair_table = None if context.is_ei_iteration else read(pairs)
        files, info = {}, {}
        for group, agents in context.trainable_groups.items():
            kind, table, jsonl = group_dataset(
                context, ctx, agents, node_table, reward_table, pair_table
            )
            parquet, openai_jsonl = (dataset_file(kind, group, s) for s in ("parquet", "jsonl"))
            files[parquet] = write_parquet(paths.fs, paths.iteration_file(it, parquet), table)
            files[openai_jsonl] = write_bytes(
                paths.fs, paths.iteration_file(it, openai_jsonl), jsonl_bytes(jsonl)
            )
            info[group] = {
                "kind": kind,
                "rows": table.num_rows,
                "parquet": parquet,
                "jsonl": openai_jsonl,
            }
        return files, info

    return run_stage(paths, context, "export", compute)["info"]
