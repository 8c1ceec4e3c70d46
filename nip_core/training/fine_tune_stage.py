"""Fine-tuning one iteration: every trainable group's job, submitted once and polled to the end.

A job trains on this iteration's dataset, from the model the group uses now (or the base model
with `fine_tune_from_scratch`); with `text_rl.fine_tune_on_all_previous_rollouts` it trains on
the datasets of every iteration so far, from the base model. Job ids are written to
`fine_tune/<group>.json` right after submission and before polling, and jobs carry an
idempotency key (run, iteration, group, training fingerprint) in their metadata: a flow killed
at any moment re-attaches to its job on rerun and never submits a second one, while a rerun
after a failed job submits a new one. A succeeded job's per-step training metrics go to
`fine_tune/<group>-steps.parquet` (`nip_core.training.job_diagnostics`).
"""

from __future__ import annotations

import asyncio
import logging

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
from nip_core.run.iteration_files import fine_tune_record, fine_tune_steps
from nip_core.run.stages import run_stage
from nip_core.seeding import stable_int
from nip_core.training.fine_tune_jobs import (
    FineTuneJobError,
    fine_tuning_client,
    job_key,
    job_suffix,
)
from nip_core.training.job_diagnostics import record_training_diagnostics
from nip_core.training.model_groups import SharedModelGroup, build_groups

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
        training_seed=stable_int("fine-tune", hp.seed, context.iteration) % 2**31,
    )
    for name, group in groups.items():
        if context.group_models.get(name) != group.base_model_name:
            group.state.fine_tuned_model_name = context.group_models.get(name)
    return groups


def earlier_exports(paths: RunPaths, context: IterationContext) -> dict[int, dict]:
    """Iteration -> its export stage's datasets per group, for every iteration before this one
    that exported: what `fine_tune` trains on too under `fine_tune_on_all_previous_rollouts`
    (the flow reads them from the manifests and hands them over)."""
    found = {}
    for it in range(context.iteration):
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
    kind = chosen[-1][1]["kind"]
    method = "supervised" if kind == "sft" else kind  # "dpo" or "kto"
    return jsonl, sum(info["rows"] for _, info in chosen), method


async def submit_and_wait(
    paths: RunPaths, context: IterationContext, exports: dict[int, dict]
) -> dict:
    it = context.iteration
    groups = groups_for(context)
    from_base = context.hyper_params.text_rl.fine_tune_on_all_previous_rollouts

    async def one(name: str) -> dict:
        group = groups[name]
        record = paths.iteration_file(it, fine_tune_record(name))
        if paths.fs.exists(record):
            group.set_state(read_json(paths.fs, record)["state"])
        if not paths.fs.exists(record) or await group.fine_tune_job_failed():
            # First run, or a rerun after a failed job: submit (a failed job is never reused).
            if group.state.fine_tune_job_id is not None:
                log.warning(
                    "group %s: job %s failed; submitting a new one",
                    name,
                    group.state.fine_tune_job_id,
                )
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
        result = {
            "job_id": group.state.fine_tune_job_id,
            "status": status,
            "skip_reason": group.state.skip_reason,
            "failed_jobs": group.state.failed_jobs,
        }
        training = await record_training_diagnostics(paths, it, group)
        return result | ({"training": training} if training is not None else {})

    names = list(context.trainable_groups)
    try:
        results = await asyncio.gather(*(one(n) for n in names))
    finally:
        await close_clients(groups.values())
    return dict(zip(names, results, strict=True))


async def switch_groups(
    paths: RunPaths, context: IterationContext, jobs: dict[str, str]
) -> dict[str, str]:
    """The model each group uses after its job (`jobs`: group -> its job record): the
    fine-tuned one (or the current one when nothing was trained)."""
    groups = groups_for(context)
    models = dict(context.group_models)
    try:
        for name in context.trainable_groups:
            groups[name].set_state(read_json(paths.fs, jobs[name])["state"])
            models[name] = await groups[name].switch_to_next_model(context.iteration)
    finally:
        await close_clients(groups.values())
    return models


def fine_tune(
    paths: RunPaths,
    context: IterationContext,
    datasets: dict[str, dict],
    earlier_datasets: dict[int, dict] | None = None,
) -> dict[str, str]:
    """Run (or reuse) the stage "fine_tune" on the export stage's `datasets` (and, with
    `fine_tune_on_all_previous_rollouts`, on `earlier_datasets`, iteration -> that iteration's
    `datasets`: `earlier_exports`); returns each trainable group's job record
    (`fine_tune/<group>.json`)."""
    it = context.iteration
    exports = dict(earlier_datasets or {}) | {it: datasets}

    def digest(name: str) -> str:
        return sha256_bytes(read_bytes(paths.fs, paths.iteration_file(it, name)))

    def compute():
        info = asyncio.run(submit_and_wait(paths, context, exports))
        files = {fine_tune_record(g): digest(fine_tune_record(g)) for g in info}
        steps = [fine_tune_steps(g) for g in info]  # jobs that reported steps only
        steps = [s for s in steps if paths.fs.exists(paths.iteration_file(it, s))]
        return files | {name: digest(name) for name in steps}, info

    run_stage(paths, context, "fine_tune", compute)
    return {g: paths.iteration_file(it, fine_tune_record(g)) for g in context.trainable_groups}


def switch_to_fine_tuned(
    paths: RunPaths, context: IterationContext, jobs: dict[str, str]
) -> dict[str, str]:
    """Run (or reuse) the stage "switch_model": the model each group would use from the next
    iteration on, its fine-tuned model (the switch guard, a stage of its own, may still keep
    the previous one)."""

    def compute():
        return {}, {"models_after": asyncio.run(switch_groups(paths, context, jobs))}

    return run_stage(paths, context, "switch_model", compute)["info"]["models_after"]
