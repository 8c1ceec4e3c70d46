"""Stage: per-group training datasets (`datasets/{dpo,sft}/<group>.parquet` + OpenAI `.jsonl`).

MALT iterations export DPO pairs; expert-iteration iterations (`pure_text_ei`, or the first
`num_initial_ei_iterations` of MALT) export SFT rollouts. Frozen groups get no dataset.
"""

from __future__ import annotations

from prefect import task

from nip_core.malt import dataset_export as export
from nip_core.malt import verifier_rows
from nip_core.malt.rollout_tree import batch_items
from nip_core.run.artifacts import RunPaths, jsonl_bytes, read_parquet, write_bytes, write_parquet
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import (
    BATCH_FILE,
    NODES_FILE,
    PAIRS_FILE,
    REWARDS_FILE,
    dataset_file,
)
from nip_core.run.stages import run_stage
from nip_core.seeding import stable_int


def export_datasets(paths: RunPaths, context: IterationContext) -> dict:
    hp = context.hyper_params
    it = context.iteration

    def compute():
        read = lambda name: read_parquet(paths.fs, paths.iteration_file(it, name))  # noqa: E731
        nodes, rewards = read(NODES_FILE), read(REWARDS_FILE)
        items = {item.batch_index: item for item in batch_items(read(BATCH_FILE))}
        ctx = export.ExportContext(context.protocol, context.agent_params, items, it)
        files, info = {}, {}
        if not context.is_ei_iteration:
            pairs = read(PAIRS_FILE)
        for group, agents in context.trainable_groups.items():
            if context.is_ei_iteration:
                kind = "sft"
                rows = export.sft_rows(
                    nodes,
                    rewards,
                    ctx,
                    agents,
                    context.agent_names,
                    hp.pure_text_ei,
                    hp.text_rl,
                    hp.seed,
                )
                if hp.pure_text_malt.balance_verifier_by_label:
                    rows = verifier_rows.balance_verifier_rollouts(
                        rows,
                        context.protocol.verifier_name,
                        {item.datapoint.id: item.datapoint.y for item in items.values()},
                        stable_int("sft-balance", hp.seed, it),
                    )
                if not context.agent_params[agents[0]].shuffle_training_data:
                    rows = export.alternate_verdicts(rows, "messages")
                table, jsonl = export.sft_table(rows), export.sft_openai_jsonl(rows)
            else:
                kind = "dpo"
                rows = verifier_rows.verifier_signal_rows(
                    nodes, pairs, ctx, agents, hp.pure_text_malt, hp.text_rl, hp.seed
                )
                if not context.agent_params[agents[0]].shuffle_training_data:
                    rows = export.alternate_verdicts(rows, "chosen")
                table, jsonl = export.dpo_table(rows), export.dpo_openai_jsonl(rows)
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

    return run_stage(paths, context, "export", compute)


@task(name="export-datasets")
def export_datasets_task(paths: RunPaths, context: IterationContext) -> dict:
    return export_datasets(paths, context)["info"]
