"""Stage: score fine-tuned models against the previous ones before switching (`switch_guard`).

Runs after the switch stage; with `text_rl.switch_guard` off it passes the new models through. Each scoring is an evaluation
on the first `text_rl.switch_guard_episodes` validation episodes (one sample per turn, the same
datapoints and call seeds for both models), written to `guard-<label>.parquet`. All scorings
share one call journal (`guard-calls-*.jsonl`): an interrupted guard replays its finished calls,
and calls of agents whose model is unchanged are made once. The manifest
stage `switch_guard` records both scores, the margin and the verdict per group.
"""

from __future__ import annotations

import asyncio
import logging

from prefect import task

from nip_core.data import datapoints
from nip_core.data.splits import load_split
from nip_core.malt.evaluation import evaluation_items, evaluation_metrics, evaluation_table
from nip_core.run.artifacts import RunPaths, write_parquet
from nip_core.run.iteration_context import IterationContext, build_context
from nip_core.run.stages import record_models_after, run_stage
from nip_core.training.switch_guard import group_score, guarded_models, verdict
from tasks import TRANSIENT_RETRY
from tasks.evaluate import _grow_then_close, evaluation_settings, journaled_clients

log = logging.getLogger(__name__)


def score_models(
    paths: RunPaths, context: IterationContext, group_models: dict[str, str], label: str
) -> dict[str, float | None]:
    """Mean episode reward per agent when the groups use `group_models` (validation episodes)."""
    hp = context.hyper_params
    scored = build_context(hp, context.run_name, context.iteration, group_models)
    points = datapoints(load_split(hp, "validation"))
    count = min(hp.text_rl.switch_guard_episodes, len(points))
    items = evaluation_items(points, count, hp.seed, "validation")
    it = context.iteration
    # One journal for every scoring: a call that an earlier scoring already made (an agent
    # whose model is the same in both) is replayed, not asked again.
    clients = journaled_clients(paths, scored, "guard")
    settings = evaluation_settings(scored, clients, "validation")
    nodes = asyncio.run(_grow_then_close(items, settings, None))
    table = evaluation_table(
        nodes, scored.agent_names, iteration=it, protocol=scored.protocol.name, split="validation"
    )
    write_parquet(paths.fs, paths.iteration_file(it, f"guard-{label}.parquet"), table)
    metrics = evaluation_metrics(table, scored.agent_names)
    return {a: m["mean_episode_reward"] for a, m in metrics["agents"].items()}


def validation_available(context: IterationContext) -> bool:
    """Whether the carved validation split has any datapoint (tiny train sets may have none)."""
    try:
        return len(load_split(context.hyper_params, "validation")) > 0
    except ValueError:
        return False


def guard_switch(
    paths: RunPaths, context: IterationContext, candidates: dict[str, str]
) -> dict[str, str]:
    """The models to switch to: each changed group's candidate, unless the guard keeps the old."""
    current = dict(context.group_models)
    changed = [g for g, model in candidates.items() if model != current.get(g)]
    if not changed:
        return dict(candidates)
    margin = context.hyper_params.text_rl.switch_guard_margin
    if not validation_available(context):
        log.warning(
            "switch guard: the validation split is empty (raise text_rl.validation_fraction or "
            "the train size); switching without a check"
        )
        return dict(candidates)

    def compute():
        previous = score_models(paths, context, current, "previous")
        report = {}
        for group in changed:
            trial = score_models(paths, context, current | {group: candidates[group]}, group)
            agents = context.groups[group]
            old, new = group_score(previous, agents), group_score(trial, agents)
            report[group] = {
                "previous_model": current[group],
                "new_model": candidates[group],
                "previous_score": old,
                "new_score": new,
                "margin": margin,
                "episodes": context.hyper_params.text_rl.switch_guard_episodes,
                "verdict": verdict(old, new, margin),
            }
        return {}, report

    report = run_stage(paths, context, "switch_guard", compute)["info"]
    for group, entry in report.items():
        log.warning(
            "switch guard, group %s: previous model %.3f, new model %.3f (margin %s): %s",
            group,
            entry["previous_score"],
            entry["new_score"],
            entry["margin"],
            entry["verdict"],
        )
    return guarded_models(current, candidates, {g: e["verdict"] for g, e in report.items()})


@task(name="switch-guard", **TRANSIENT_RETRY)
def switch_guard_task(
    paths: RunPaths, context: IterationContext, candidates: dict[str, str]
) -> dict[str, str]:
    """The models the next iteration uses (kept in the manifest as `models_after`)."""
    if context.hyper_params.text_rl.switch_guard:
        models = guard_switch(paths, context, candidates)
    else:
        models = dict(candidates)
    record_models_after(paths, context, models)
    return models
