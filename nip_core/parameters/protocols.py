"""Interaction-protocol parameters: rewards shared by all protocols, and rounds per family."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nip_core.parameters.base import BaseParameters, register_parameter_class


@register_parameter_class
@dataclass(frozen=True)
class CommonProtocolParameters(BaseParameters):
    """Turn order, stance randomisation and the reward table used by every protocol."""

    verifier_first: bool = True
    randomize_prover_stance: bool = False
    prover_reward: float = 1.0
    verifier_reward: float = 1.0
    verifier_incorrect_penalty: float = -1.0
    verifier_terminated_penalty: float = -1.0
    verifier_no_guess_reward: float = 0.0
    shared_reward: bool = False
    force_guess: Literal["zero", "one", "y"] | None = None


@register_parameter_class
@dataclass(frozen=True)
class NipProtocolParameters(BaseParameters):
    """NIP family (nip, adp, merlin_arthur, solo_verifier): the verifier may decide from
    round `min_message_rounds - 1` and must by round `max_message_rounds - 1`."""

    max_message_rounds: int = 8
    min_message_rounds: int = 1


@register_parameter_class
@dataclass(frozen=True)
class DebateProtocolParameters(BaseParameters):
    """Debate: two provers argue; simultaneous or sequential, with optional channel shuffling."""

    max_message_rounds: int = 8
    min_message_rounds: int = 1
    sequential: bool = False
    prover0_first: bool = True
    randomize_channel_order: bool = True


@register_parameter_class
@dataclass(frozen=True)
class MnipProtocolParameters(BaseParameters):
    """Multi-prover NIP: same knobs as debate, but each prover talks to the verifier privately."""

    max_message_rounds: int = 8
    min_message_rounds: int = 1
    sequential: bool = False
    prover0_first: bool = True
    randomize_channel_order: bool = True
