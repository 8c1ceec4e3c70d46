"""Interaction-protocol parameters: rewards shared by all protocols, and rounds per family."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from nip_core.parameters.base import BaseParameters, register_parameter_class

ForceGuess = Literal["zero", "one", "y"]


@dataclass(frozen=True, kw_only=True)
class ProtocolRules:
    """Turn order, stance randomisation and the reward table every protocol shares, declared
    once: the configuration's `protocol_common` holds them, and each built `Protocol` record
    carries a copy (`rules_of`) so that the pure protocol functions need no configuration."""

    verifier_first: bool = True
    randomize_prover_stance: bool = False
    prover_reward: float = 1.0
    verifier_reward: float = 1.0
    verifier_incorrect_penalty: float = -1.0
    verifier_terminated_penalty: float = -1.0
    verifier_no_guess_reward: float = 0.0
    shared_reward: bool = False
    force_guess: ForceGuess | None = None
    # A verdict in a verifier turn where it cannot count (before `min_message_rounds - 1`) ends
    # the episode undecided, with `verifier_terminated_penalty`; False reads it as a message.
    # Rolled out, a question then outranks an early verdict: the verifier must hear a prover.
    early_decision_ends_episode: bool = False


def rules_of(settings: ProtocolRules) -> dict[str, Any]:
    """The `ProtocolRules` fields of `settings` (e.g. `protocol_common`), by name."""
    return {f.name: getattr(settings, f.name) for f in fields(ProtocolRules)}


@register_parameter_class
@dataclass(frozen=True)
class CommonProtocolParameters(BaseParameters, ProtocolRules):
    """`protocol_common`: the `ProtocolRules` used by every protocol."""


@register_parameter_class
@dataclass(frozen=True)
class NipProtocolParameters(BaseParameters):
    """NIP family (nip, adp, merlin_arthur, solo_verifier, pairwise, fill_in, fill_in_choice):
    the verifier may decide from round `min_message_rounds - 1` and must by round
    `max_message_rounds - 1`."""

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
