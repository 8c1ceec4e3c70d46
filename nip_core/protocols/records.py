"""Frozen records describing an interaction protocol: who talks, on which channel, for what reward.

Behaviour (schedules, rewards) lives in plain functions in the sibling modules; these classes only
hold data so that a protocol can be pickled, compared and printed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import get_args

from nip_core.parameters.protocols import ForceGuess, ProtocolRules

FORCE_GUESS_VALUES: tuple[str, ...] = get_args(ForceGuess)

VERIFIER = "verifier"
MAIN_CHANNEL = "main"


@dataclass(frozen=True)
class AgentSpec:
    """How one agent appears in a protocol: its display name, what it sees and what it argues.

    `response_headers` is set for agents that write to several channels in one message: each
    header line in the output starts the part of the message sent on that channel.
    `last_round_message` is a system message for the agent's final opportunity to act (see
    `last_active_round`), and `default_stance` is the verdict a prover argues for when the stance is
    not randomised (1 accept, 0 reject; meaningless for the verifier).
    """

    name: str
    human_name: str
    is_verifier: bool
    visible_channels: tuple[str, ...]
    response_headers: dict[str, str] | None = None
    anonymous: bool = False
    last_round_message: str | None = None
    default_stance: int = 1

    def __hash__(self) -> int:
        # The headers dict makes the generated hash fail; hash the items instead.
        headers = tuple(sorted(self.response_headers.items())) if self.response_headers else None
        return hash((self.name, self.human_name, self.visible_channels, headers))


@dataclass(frozen=True)
class Protocol(ProtocolRules):
    """Everything the rollout, reward and prompt code needs to know about one protocol.

    Round numbers are 0-based and an episode has at most `max_message_rounds` rounds. The turn
    order, stance and reward fields (`ProtocolRules`, keyword-only) are copied from the common
    protocol parameters so that the pure functions need no access to the configuration.
    """

    name: str
    agents: tuple[AgentSpec, ...]
    channels: tuple[str, ...]
    max_message_rounds: int
    min_message_rounds: int
    max_verifier_questions: int
    stance_randomisable: bool
    sequential: bool = False
    prover0_first: bool = True
    randomize_channel_order: bool = False

    @functools.cached_property
    def agent_names(self) -> tuple[str, ...]:
        """Agent names in the reference order (provers first, verifier last)."""
        return tuple(spec.name for spec in self.agents)

    @functools.cached_property
    def verifier_name(self) -> str:
        """Name of the single verifier agent."""
        return next(spec.name for spec in self.agents if spec.is_verifier)

    @functools.cached_property
    def prover_names(self) -> tuple[str, ...]:
        """Names of all non-verifier agents, in agent order."""
        return tuple(spec.name for spec in self.agents if not spec.is_verifier)

    def agent(self, name: str) -> AgentSpec:
        """The spec of agent `name`; a clear error for names this protocol does not have."""
        for spec in self.agents:
            if spec.name == name:
                return spec
        raise ValueError(
            f"protocol {self.name!r} has no agent {name!r}; its agents are {self.agent_names}"
        )


@dataclass(frozen=True)
class StepOutcome:
    """What one round of an episode settles.

    `done` means the verifier made a decision; `terminated` means the episode ran out of rounds
    without one. Either ends the episode (see `ended`). `rewards` has an entry for every agent.
    """

    decided: bool
    done: bool
    terminated: bool
    rewards: dict[str, float]

    @property
    def ended(self) -> bool:
        """True when no further round follows this one."""
        return self.done or self.terminated
