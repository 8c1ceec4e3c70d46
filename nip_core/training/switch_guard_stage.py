"""The switch guard's stage: score fine-tuned models against the previous ones before switching.

Runs after the switch stage; with `text_rl.switch_guard` off it passes the new models through.
Each scoring is an evaluation on the first `text_rl.switch_guard_episodes` validation episodes
(one sample per turn, the same datapoints and call seeds for every scoring), written to
`guard-<label>.parquet`. Two scorings decide the common case, whatever the number of groups
trained: the previous models, and every changed group's candidate together (`together`, the
models the next iteration would play with). Only a group that fails there is scored alone, its
candidate beside the other groups' previous models (`guard-<group>.parquet`), and judged on that.

All scorings share one call journal (`guard-calls-*.jsonl`): an interrupted guard replays its
finished calls, and calls of agents whose model is unchanged are made once. The guard also
replays earlier iterations' journals, so its previous model, which the guard before scored as
the new one (or kept), is not asked again; and `score_previous_models` plays the previous
models' scoring while the iteration's rollouts run (their requests share the server's batches),
so in a first iteration too the guard replays it. With a self-hosted group and
`text_rl.switch_guard_max_drift` set, the previous model then scores both models' replies
(`/v1/chat/score`) to catch a wreck the reward misses, where the reward and verdict-share checks
alone would let the new model in. The manifest stage `switch_guard` records both scores, the
margin, the drift, the verdict with its reason and which scoring decided it per group; the pure
rules live in `nip_core.training.switch_guard`.
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
from nip_core.run.stages import finished_stage, record_models_after, run_stage
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
# One scoring: mean episode reward per agent, replies, (verifier decisions, labels).
Scoring = tuple[dict[str, float | None], Replies, tuple[list, list]]
PREVIOUS = "previous"  # the scoring of the models the iteration started from
TOGETHER = "together"  # every changed group's candidate in one scoring
ALONE = "alone"  # one group's candidate beside the other groups' previous models


def score_models(
    paths: RunPaths, context: IterationContext, group_models: dict[str, str], label: str
) -> Scoring:
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
    context: IterationContext,
    group: str,
    candidate: str,
    previous: Scoring,
    trial: Scoring,
) -> dict:
    """The manifest entry of the group's candidate: its scoring `trial` against `previous`."""
    text_rl = context.hyper_params.text_rl
    trial_scores, trial_replies, (decisions, labels) = trial
    agents = context.groups[group]
    max_share = text_rl.switch_guard_max_verdict_share
    share = None
    if max_share is not None and context.protocol.verifier_name in agents:
        share = verdict_share(decisions, labels, max_share)
    old, new = group_score(previous[0], agents), group_score(trial_scores, agents)
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


def candidate_reports(
    paths: RunPaths,
    context: IterationContext,
    candidates: dict[str, str],
    changed: list[str],
    previous: Scoring,
) -> dict[str, dict]:
    """Each changed group's manifest entry. With several, their candidates play together first
    (one scoring, whatever the number of groups); a group that fails there is scored alone,
    beside the other groups' previous models, as a single changed group always is."""
    models = dict(context.group_models)
    report: dict[str, dict] = {}
    if len(changed) > 1:
        together = models | {g: candidates[g] for g in changed}
        trial = score_models(paths, context, together, TOGETHER)
        for group in changed:
            entry = group_report(context, group, candidates[group], previous, trial)
            report[group] = entry | {"scored": TOGETHER}
    for group in changed:
        if group in report and report[group]["verdict"] == SWITCHED:
            continue
        trial = score_models(paths, context, models | {group: candidates[group]}, group)
        entry = group_report(context, group, candidates[group], previous, trial)
        report[group] = entry | {"scored": ALONE}
    return report


def guard_needed(context: IterationContext) -> bool:
    """Whether this iteration's switch guard may score anything: it is on, a group trains and
    the validation split has episodes."""
    text_rl = context.hyper_params.text_rl
    return bool(text_rl.switch_guard and context.trainable_groups and validation_available(context))


def score_previous_models(paths: RunPaths, context: IterationContext) -> bool:
    """Play the guard's scoring of the previous models ahead of the guard (the flow runs it
    beside the rollouts, which ask the same models): the guard then replays it from the journal.
    Writes no manifest entry; False when the guard will not need it."""
    if not guard_needed(context) or finished_stage(paths, context, "switch_guard") is not None:
        return False
    score_models(paths, context, dict(context.group_models), PREVIOUS)
    return True


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
        previous = score_models(paths, context, current, PREVIOUS)
        return {}, candidate_reports(paths, context, candidates, changed, previous)

    report = run_stage(paths, context, "switch_guard", compute)["info"]
    for group, entry in report.items():
        log.warning(
            "switch guard, group %s (scored %s): previous model %.3f, new model %.3f (margin %s), "
            "drift %s nats/token (max %s), one verdict's share %s (max %s): %s%s",
            group,
            entry.get("scored", ALONE),
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
