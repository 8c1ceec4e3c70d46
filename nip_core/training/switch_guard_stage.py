"""The switch guard's stage: score fine-tuned models against the previous ones before switching.

Runs after the switch stage; with `text_rl.switch_guard` off it passes the new models through.
Each scoring is an evaluation on the first `text_rl.switch_guard_episodes` validation episodes
(one sample per turn, the same datapoints and call seeds for both models), written to
`guard-<label>.parquet`. All scorings share one call journal (`guard-calls-*.jsonl`): an
interrupted guard replays its finished calls, and calls of agents whose model is unchanged are
made once. The guard also replays earlier iterations' journals, so its previous model, which
the guard before scored as the new one (or kept), is not asked again. With a self-hosted group and `text_rl.switch_guard_max_drift` set, the previous model
then scores both models' replies (`/v1/chat/score`) to catch a wreck the reward misses, where
the reward and verdict-share checks alone would let the new model in. The
manifest stage `switch_guard` records both scores, the margin, the drift and the verdict with
its reason per group; the pure rules live in `nip_core.training.switch_guard`.
"""

from __future__ import annotations

import asyncio
import logging

from nip_core.agents.message_scores import score_replies
from nip_core.data import datapoints
from nip_core.data.splits import load_split
from nip_core.malt.dataset_export import ExportContext, last_replies
from nip_core.malt.evaluation import (
    evaluation_items,
    evaluation_metrics,
    evaluation_table,
    label_balanced_items,
)
from nip_core.play.episodes import evaluation_settings, journaled_clients, play
from nip_core.run.artifacts import RunPaths, write_parquet
from nip_core.run.iteration_context import IterationContext, with_group_models
from nip_core.run.iteration_files import GUARD_STEM, guard_file
from nip_core.run.stages import record_models_after, run_stage
from nip_core.training.switch_guard import (
    SWITCHED,
    drift,
    group_score,
    guard_verdict,
    guarded_models,
    logprob_per_token,
    verdict_share,
)

log = logging.getLogger(__name__)


Replies = dict[str, list[list[dict]]]  # agent -> each episode's chat ending with its last reply


def score_models(
    paths: RunPaths, context: IterationContext, group_models: dict[str, str], label: str
) -> tuple[dict[str, float | None], Replies, tuple[list, list]]:
    """Mean episode reward per agent when the groups use `group_models` (validation episodes),
    each agent's replies, and the episodes' (verifier decisions, labels)."""
    hp = context.hyper_params
    scored = with_group_models(context, group_models)
    points = datapoints(load_split(hp, "validation"))
    count = min(hp.text_rl.switch_guard_episodes, len(points))
    pick = label_balanced_items if hp.text_rl.switch_guard_balance_labels else evaluation_items
    items = pick(points, count, hp.seed, "validation")
    it = context.iteration
    # One journal for every scoring: a call that an earlier scoring already made (an agent
    # whose model is the same in both) is replayed, not asked again.
    clients = journaled_clients(paths, scored, GUARD_STEM)
    settings = evaluation_settings(scored, clients, "validation")
    nodes = asyncio.run(play(items, settings))
    table = evaluation_table(
        nodes, scored.agent_names, iteration=it, protocol=scored.protocol.name, split="validation"
    )
    write_parquet(paths.fs, paths.iteration_file(it, guard_file(label)), table)
    metrics = evaluation_metrics(table, scored.agent_names)
    export = ExportContext(
        scored.protocol, scored.agent_params, {i.batch_index: i for i in items}, it
    )
    replies = last_replies(nodes, export, scored.agent_names)
    verdicts = (table.column("decision").to_pylist(), table.column("y").to_pylist())
    return {a: m["mean_episode_reward"] for a, m in metrics["agents"].items()}, replies, verdicts


def reply_drift(
    context: IterationContext, group: str, previous: Replies, new: Replies
) -> tuple[float | None, float | None]:
    """(previous model's own replies, new model's replies) in nats per token under the
    previous model, over the group's agents; None where the provider cannot score."""
    model = context.group_models[group]
    own, trial = [], []
    for agent in context.groups[group]:
        params = context.agent_params[agent]
        own_scores = score_replies(params, model, previous.get(agent, []))
        new_scores = score_replies(params, model, new.get(agent, []))
        if own_scores is None or new_scores is None:
            return None, None
        own += own_scores
        trial += new_scores
    return logprob_per_token(own), logprob_per_token(trial)


def validation_available(context: IterationContext) -> bool:
    """Whether the carved validation split has any datapoint (tiny train sets may have none)."""
    try:
        return len(load_split(context.hyper_params, "validation")) > 0
    except ValueError:
        return False


def group_report(
    paths: RunPaths,
    context: IterationContext,
    group: str,
    candidate: str,
    previous: tuple[dict[str, float | None], Replies, tuple[list, list]],
) -> dict:
    """Score the group's candidate against the previous models; the manifest entry."""
    text_rl = context.hyper_params.text_rl
    models = dict(context.group_models) | {group: candidate}
    trial, trial_replies, (decisions, labels) = score_models(paths, context, models, group)
    agents = context.groups[group]
    max_share = text_rl.switch_guard_max_verdict_share
    share = None
    if max_share is not None and context.protocol.verifier_name in agents:
        share = verdict_share(decisions, labels, max_share)
    old, new = group_score(previous[0], agents), group_score(trial, agents)
    margin = text_rl.switch_guard_margin
    decided, reason = guard_verdict(old, new, margin, share=share, max_share=max_share)
    own, moved = None, None
    # The drift check scores every episode's reply twice under the previous model (a fifth of
    # the default iteration's guard): asked only when the free checks would let the model in.
    if text_rl.switch_guard_max_drift is not None and decided == SWITCHED:
        own, moved = reply_drift(context, group, previous[1], trial_replies)
    nats = drift(own, moved)
    if nats is not None:
        decided, reason = guard_verdict(
            old, new, margin, nats, text_rl.switch_guard_max_drift, share, max_share
        )
    return {
        "previous_model": context.group_models[group],
        "new_model": candidate,
        "previous_score": old,
        "new_score": new,
        "margin": text_rl.switch_guard_margin,
        "episodes": text_rl.switch_guard_episodes,
        "previous_logprob_per_token": own,
        "new_logprob_per_token": moved,
        "drift": nats,
        "max_drift": text_rl.switch_guard_max_drift,
        "verdict_share": share,
        "max_verdict_share": max_share,
        "verdict": decided,
        "reason": reason,
    }


def guard_switch(
    paths: RunPaths, context: IterationContext, candidates: dict[str, str]
) -> dict[str, str]:
    """The models to switch to: each changed group's candidate, unless the guard keeps the old."""
    current = dict(context.group_models)
    changed = [g for g, model in candidates.items() if model != current.get(g)]
    if not changed:
        return dict(candidates)
    if not validation_available(context):
        log.warning(
            "switch guard: the validation split is empty (raise text_rl.validation_fraction or "
            "the train size); switching without a check"
        )
        return dict(candidates)

    def compute():
        previous = score_models(paths, context, current, "previous")
        report = {
            group: group_report(paths, context, group, candidates[group], previous)
            for group in changed
        }
        return {}, report

    report = run_stage(paths, context, "switch_guard", compute)["info"]
    for group, entry in report.items():
        log.warning(
            "switch guard, group %s: previous model %.3f, new model %.3f (margin %s), "
            "drift %s nats/token (max %s), one verdict's share %s (max %s): %s%s",
            group,
            entry["previous_score"],
            entry["new_score"],
            entry["margin"],
            "n/a" if entry.get("drift") is None else f"{entry['drift']:.2f}",
            entry.get("max_drift"),
            "n/a" if entry.get("verdict_share") is None else f"{entry['verdict_share']:.2f}",
            entry.get("max_verdict_share"),
            entry["verdict"],
            f" ({entry['reason']})" if entry.get("reason") else "",
        )
    return guarded_models(current, candidates, {g: e["verdict"] for g, e in report.items()})


def switch_models(
    paths: RunPaths, context: IterationContext, candidates: dict[str, str]
) -> dict[str, str]:
    """The models the next iteration uses, kept in the manifest as `models_after`."""
    if context.hyper_params.text_rl.switch_guard:
        models = guard_switch(paths, context, candidates)
    else:
        models = dict(candidates)
    record_models_after(paths, context, models)
    return models
