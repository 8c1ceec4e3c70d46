"""Plain records shared by protocols, prompts, rollouts and export.

A tree node holds one `Turn`: what every agent active in that round wrote. The history of a node
is the sequence of turns on the path from its root, which is all a prompt builder needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

REJECT: Final = 0
ACCEPT: Final = 1
DECISION_NAMES: Final = {REJECT: "reject", ACCEPT: "accept"}


@dataclass(frozen=True)
class Datapoint:
    """One code-validation item: is `solution` a correct answer to `question`?

    In the pairwise protocol the verifier sees a second solution to the same question,
    `other_solution`, shown after `solution`; exactly one of the two is correct and `y` says
    whether it is the first (`nip_core.data.pairwise`)."""

    id: int
    question: str
    solution: str
    y: int
    prover_stance: int
    other_solution: str | None = None


@dataclass(frozen=True)
class ChannelMessage:
    """A message one agent sent on one channel."""

    agent: str
    channel: str
    content: str


@dataclass(frozen=True)
class Turn:
    """One round of an episode.

    `raw` maps each agent that acted to its full model output (including a decision text), which
    is what that agent sees of itself later; `messages` are the per-channel messages the others see.
    `decision` is the verifier's verdict (`ACCEPT`/`REJECT`) or None.
    """

    round: int
    raw: dict[str, str] = field(default_factory=dict)
    messages: tuple[ChannelMessage, ...] = ()
    decision: int | None = None
