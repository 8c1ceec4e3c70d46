"""Stages: fine-tune every trainable group on its dataset, then switch agents to the new models.

A job trains on this iteration's dataset, from the model the group uses now (or the base model
with `fine_tune_from_scratch`); with `text_rl.fine_tune_on_all_previous_rollouts` it trains on
the datasets of every iteration so far, from the base model. Job ids are written to `fine_tune/<group>.json` right after submission and before polling, and
jobs carry an idempotency key (run/iteration/group) in their metadata: a flow killed at any
moment re-attaches to its job on rerun and never submits a second one.
"""

from __future__ import annotations

import asyncio
import logging

from prefect import task

from nip_core.agents.clients import close_clients
from nip_core.malt.dataset_export import training_datasets
from nip_core.run.artifacts import (
    RunPaths,
    load_manifest,
    read_bytes,
    read_json,
    sha256_bytes,
    write_json,
)
from nip_core.run.iteration_context import IterationContext
from nip_core.run.stages import run_stage
from nip_core.training.model_groups import (
    FineTuneJobError,
    SharedModelGroup,
    build_groups,
    fine_tuning_client,
    job_key,
    job_suffix,
)
from tasks import TRANSIENT_RETRY

log = logging.getLogger(__name__)
POLL_START, POLL_MAX = 1.0, 30.0


def groups_for(context: IterationContext) -> dict[str, SharedModelGroup]:
    hp = context.hyper_params
    clients = {g: fine_tuning_client(context.agent_params[a[0]]) for g, a in context.groups.items()}
    groups = build_groups(
        context.groups,
        context.agent_params,
        rl_num_epochs=hp.rl.num_epochs,
        rl_learning_rate=hp.rl.learning_rate,
        clients=clients,
    )
    for name, group in groups.items():
        if context.group_models.get(name) != group.base_model_name:
            group.state.fine_tuned_model_name = context.group_models.get(name)
    return groups


def exported_datasets(paths: RunPaths, context: IterationContext) -> dict[int, dict]:
    """Iteration -> its export stage's datasets per group, for this and every earlier iteration."""
    found = {}
    for it in range(context.iteration + 1):
        manifest = load_manifest(paths, it, context.run_name, context.hyper_params.config_hash())
        export = manifest.get("stages", {}).get("export")
        if export is not None:
            found[it] = export["info"]
    return found


def training_data(
    paths: RunPaths, context: IterationContext, exports: dict[int, dict], group: str
) -> tuple[bytes, int, str]:
    """(JSONL bytes, rows, method) of the group's job, per fine_tune_on_all_previous_rollouts."""
    all_previous = context.hyper_params.text_rl.fine_tune_on_all_previous_rollouts
    chosen = training_datasets(exports, group, context.iteration, all_previous)
    if not chosen:
        return b"", 0, "dpo"
    parts = [read_bytes(paths.fs, paths.iteration_file(it, info["jsonl"])) for it, info in chosen]
    jsonl = b"".join(p if p.endswith(b"\n") or not p else p + b"\n" for p in parts)
    method = "supervised" if chosen[-1][1]["kind"] == "sft" else "dpo"
    return jsonl, sum(info["rows"] for _, info in chosen), method


async def _submit_and_wait(paths: RunPaths, context: IterationContext) -> dict:
    it = context.iteration
    groups = groups_for(context)
    exports = exported_datasets(paths, context)
    from_base = context.hyper_params.text_rl.fine_tune_on_all_previous_rollouts

    async def one(name: str) -> dict:
        group = groups[name]
        record = paths.iteration_file(it, f"fine_tune/{name}.json")
        if paths.fs.exists(record):
            group.set_state(read_json(paths.fs, record)["state"])
        else:
            jsonl, rows, method = training_data(paths, context, exports, name)
            await group.create_fine_tune_job(
                method,
                jsonl,
                rows,
                key=job_key(context.run_name, it, name),
                suffix=job_suffix(context.run_name, it, name),
                from_base_model=from_base,
            )
            write_json(paths.fs, record, {"group": name, "state": group.get_state()})
        delay = POLL_START
        while (status := await group.get_fine_tune_job_status()) in ("pending", "running"):
            await asyncio.sleep(delay)
            delay = min(POLL_MAX, delay * 1.5)
        if status != "succeeded":
            error = await group.get_fine_tune_job_error_repr() if status == "failed" else status
            raise FineTuneJobError(
                f"group {name}: job {group.state.fine_tune_job_id} {status}: {error}"
            )
        return {
            "job_id": group.state.fine_tune_job_id,
            "status": status,
            "skip_reason": group.state.skip_reason,
        }

    names = list(context.trainable_groups)
    try:
        results = await asyncio.gather(*(one(n) for n in names))
    finally:
        await close_clients(groups.values())
    return dict(zip(names, results, strict=True))


def fine_tune(paths: RunPaths, context: IterationContext) -> dict:
    def compute():
        info = asyncio.run(_submit_and_wait(paths, context))
        files = {
            f"fine_tune/{g}.json": sha256_bytes(
                read_bytes(paths.fs, paths.iteration_file(context.iteration, f"fine_tune/{g}.json"))
            )
            for g in info
        }
        return files, info

    return run_stage(paths, context, "fine_tune", compute)


def switch_models(paths: RunPaths, context: IterationContext) -> dict[str, str]:
    """The model each group would use from the next iteration on: its fine-tuned model (the
    switch guard, a stage of its own, may still keep the previous one)."""
    it = context.iteration

    def compute():
        groups = groups_for(context)
        models = dict(context.group_models)

        async def switch():
            try:
                for name in context.trainable_groups:
                    record = read_json(paths.fs, paths.iteration_file(it, f"fine_tune/{name}.json"))
                    groups[name].set_state(record["state"])
                    models[name] = await groups[name].switch_to_next_model(it)
            finally:
                await close_clients(groups.values())

        asyncio.run(switch())
        return {}, {"models_after": models}

    return run_stage(paths, context, "switch_model", compute)["info"]["models_after"]


@task(
    name="fine-tune",
    **TRANSIENT_RETRY,
)
def fine_tune_task(paths: RunPaths, context: IterationContext) -> dict:
    return fine_tune(paths, context)["info"]


@task(name="switch-model", **{**TRANSIENT_RETRY, "retry_delay_seconds": [5, 30]})
def switch_model_task(paths: RunPaths, context: IterationContext) -> dict[str, str]:
    return switch_models(paths, context)
