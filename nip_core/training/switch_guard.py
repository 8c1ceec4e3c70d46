"""The switch guard: keep the previous model when the fine-tuned one scores worse.

A DPO step can wreck a small model (answers turn into runs of one token). Before the switch, the
new and the previous model of each trained group play the same validation episodes (problems
carved from the train split, same datapoints and seeds: a paired comparison); the group keeps
its previous model when the new one's score is lower by more than a margin. The score is the
mean episode reward of the group's agents.

A reward can miss a wreck: a prover's reward is the verifier's verdict, and a verifier that
accepts word salad rewards it. So the guard also asks the previous model how likely it finds
each model's replies on those episodes (nats per token): the new model's replies falling more
than `max_drift` below the previous model's own marks the new model as degenerate, whatever
its reward. And a verifier that answers one verdict on (nearly) every episode scores 0.5 on a
label-balanced split, which beats a base model that rarely decides: the guard keeps the
previous model when the new verifier's decided verdicts are `max_share` or more one answer
while the episodes' labels are mixed. The reference library has no such guard. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SWITCHED = "switched"
KEPT_PREVIOUS = "kept_previous"


def group_score(agent_rewards: Mapping[str, float | None], agents: Sequence[str]) -> float:
    """Mean of the group's agents' mean episode rewards (an agent without episodes counts 0)."""
    values = [agent_rewards.get(agent) or 0.0 for agent in agents]
    return float(sum(values) / len(values)) if values else 0.0


def reward_verdict(previous_score: float, new_score: float, margin: float) -> str:
    """`switched` unless the new model is worse than the previous one by more than `margin`."""
    return KEPT_PREVIOUS if new_score < previous_score - margin else SWITCHED


def logprob_per_token(scores: Sequence[tuple[float, int]] | None) -> float | None:
    """Token-weighted mean log-probability of scored replies (None: nothing scored)."""
    if not scores:
        return None
    tokens = sum(n for _, n in scores)
    return sum(lp for lp, _ in scores) / tokens if tokens else None


def drift(previous_own: float | None, new_under_previous: float | None) -> float | None:
    """Nats per token the new model's replies lose, under the previous model, against the
    previous model's own replies (positive: less likely). None when either is unknown."""
    if previous_own is None or new_under_previous is None:
        return None
    return previous_own - new_under_previous


def verdict_share(
    decisions: Sequence[int | None], labels: Sequence[int], max_share: float
) -> float | None:
    """Share of the most common decided verdict, when it can tell a constant verdict: the
    episodes' labels are mixed (the majority label below `max_share`) and some were decided;
    None otherwise."""
    if not labels or max(labels.count(1), len(labels) - labels.count(1)) / len(labels) >= max_share:
        return None
    decided = [d for d in decisions if d is not None]
    if not decided:
        return None
    accepts = sum(1 for d in decided if d == 1)
    return max(accepts, len(decided) - accepts) / len(decided)


def guard_verdict(
    previous_score: float,
    new_score: float,
    margin: float,
    drift_nats: float | None = None,
    max_drift: float | None = None,
    share: float | None = None,
    max_share: float | None = None,
) -> tuple[str, str | None]:
    """(verdict, reason): `reward` when the score fell by more than `margin`, `drift` when the
    replies drifted more than `max_drift` nats per token, `constant_verdict` when one verdict
    makes `max_share` or more of the decided ones; (switched, None) otherwise."""
    if reward_verdict(previous_score, new_score, margin) == KEPT_PREVIOUS:
        return KEPT_PREVIOUS, "reward"
    if max_drift is not None and drift_nats is not None and drift_nats > max_drift:
        return KEPT_PREVIOUS, "drift"
    if max_share is not None and share is not None and share >= max_share:
        return KEPT_PREVIOUS, "constant_verdict"
    return SWITCHED, None


def guarded_models(
    current: Mapping[str, str], candidates: Mapping[str, str], verdicts: Mapping[str, str]
) -> dict[str, str]:
    """The model per group after the guard: the candidate unless its verdict kept the previous."""
    return {
        group: current[group] if verdicts.get(group) == KEPT_PREVIOUS else model
        for group, model in candidates.items()
    }
