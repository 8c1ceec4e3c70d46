"""The switch guard: keep the previous model when the fine-tuned one scores worse.

A DPO step can wreck a small model (answers turn into runs of one token). Before the switch, the
new and the previous model of each trained group play the same validation episodes (problems
carved from the train split, same datapoints and seeds: a paired comparison); the group keeps
its previous model when the new one's score is lower by more than a margin. The score is the
mean episode reward of the group's agents. The reference library has no such guard. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SWITCHED = "switched"
KEPT_PREVIOUS = "kept_previous"


def group_score(agent_rewards: Mapping[str, float | None], agents: Sequence[str]) -> float:
    """Mean of the group's agents' mean episode rewards (an agent without episodes counts 0)."""
    values = [agent_rewards.get(agent) or 0.0 for agent in agents]
    return float(sum(values) / len(values)) if values else 0.0


def verdict(previous_score: float, new_score: float, margin: float) -> str:
    """`switched` unless the new model is worse than the previous one by more than `margin`."""
    return KEPT_PREVIOUS if new_score < previous_score - margin else SWITCHED


def guarded_models(
    current: Mapping[str, str], candidates: Mapping[str, str], verdicts: Mapping[str, str]
) -> dict[str, str]:
    """The model per group after the guard: the candidate unless its verdict kept the previous."""
    return {
        group: current[group] if verdicts.get(group) == KEPT_PREVIOUS else model
        for group, model in candidates.items()
    }
