"""Build a `Protocol` from the hyper-parameters: one small constructor per protocol.

Each constructor's docstring says, in a sentence or two, how that game is played.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nip_core.parameters.hyper import HyperParameters
from nip_core.parameters.protocols import rules_of
from nip_core.protocols.records import (
    FORCE_GUESS_VALUES,
    MAIN_CHANNEL,
    VERIFIER,
    AgentSpec,
    Protocol,
)
from nip_core.protocols.schedule import count_verifier_rounds, validate_schedule

_DECIDE_NOW = "You have no questions left. Reply now with your decision on the solution."
_TWO_CHANNELS = ("prover0_channel", "prover1_channel")


def _verifier(channels: tuple[str, ...], **extra: Any) -> AgentSpec:
    return AgentSpec(VERIFIER, "Verifier", True, channels, **extra)


def _prover(name: str, human_name: str, channels: tuple[str, ...], **extra: Any) -> AgentSpec:
    return AgentSpec(name, human_name, False, channels, **extra)


def _rounds(group: Any) -> dict[str, int]:
    return {
        "max_message_rounds": group.max_message_rounds,
        "min_message_rounds": group.min_message_rounds,
    }


def _nip(hp: Any) -> Protocol:
    """NIP: the verifier and one expert take turns on a shared channel; the verifier asks questions
    and may stop to give its verdict in any of its own rounds."""
    agents = (
        _prover("prover", "Expert", (MAIN_CHANNEL,)),
        _verifier((MAIN_CHANNEL,), last_round_message=_DECIDE_NOW),
    )
    fields = rules_of(hp.protocol_common) | _rounds(hp.nip_protocol)
    return Protocol(
        "nip", agents, (MAIN_CHANNEL,), stance_randomisable=True, max_verifier_questions=0, **fields
    )


def _adp(hp: Any) -> Protocol:
    """ADP: the expert sends a single message, then the verifier must decide."""
    agents = (_prover("prover", "Expert", (MAIN_CHANNEL,)), _verifier((MAIN_CHANNEL,)))
    fields = rules_of(hp.protocol_common) | {"verifier_first": False}
    return Protocol(
        "adp",
        agents,
        (MAIN_CHANNEL,),
        max_message_rounds=2,
        min_message_rounds=1,
        max_verifier_questions=0,
        stance_randomisable=True,
        **fields,
    )


def _two_experts(
    hp: Any,
    name: str,
    group: Any,
    prover_channels: tuple[tuple[str, ...], ...],
    prover0_stance: int,
) -> Protocol:
    """Shared shape of debate and MNIP: two experts, one channel each, verifier on both."""
    headers = {
        "prover0_channel": "Question for Expert_1:",
        "prover1_channel": "Question for Expert_2:",
    }
    agents = (
        _prover("prover0", "Expert_1", prover_channels[0], default_stance=prover0_stance),
        _prover("prover1", "Expert_2", prover_channels[1], default_stance=1),
        _verifier(_TWO_CHANNELS, response_headers=headers, last_round_message=_DECIDE_NOW),
    )
    fields = (
        rules_of(hp.protocol_common)
        | _rounds(group)
        | {
            "sequential": group.sequential,
            "prover0_first": group.prover0_first,
            "randomize_channel_order": group.randomize_channel_order,
        }
    )
    return Protocol(
        name,
        agents,
        _TWO_CHANNELS,
        max_verifier_questions=0,
        stance_randomisable=name == "mnip",
        **fields,
    )


def _debate(hp: Any) -> Protocol:
    """Debate: Expert_1 argues for rejecting and Expert_2 for accepting; both read everything, and
    the verifier questions each of them on its own channel before deciding."""
    return _two_experts(hp, "debate", hp.debate_protocol, (_TWO_CHANNELS, _TWO_CHANNELS), 0)


def _mnip(hp: Any) -> Protocol:
    """MNIP: two experts argue for the same verdict but cannot see each other, so the verifier can
    cross-check their answers (as in interrogating witnesses separately)."""
    prover_channels = ((_TWO_CHANNELS[0],), (_TWO_CHANNELS[1],))
    return _two_experts(hp, "mnip", hp.mnip_protocol, prover_channels, 1)


def _merlin_arthur(hp: Any) -> Protocol:
    """Merlin-Arthur: one of two anonymous experts, picked by the episode seed's parity, sends one
    message (Expert_1 argues reject, Expert_2 accept); the verifier then decides without knowing
    which one spoke."""
    agents = (
        _prover("prover0", "Expert_1", (MAIN_CHANNEL,), anonymous=True, default_stance=0),
        _prover("prover1", "Expert_2", (MAIN_CHANNEL,), anonymous=True, default_stance=1),
        _verifier((MAIN_CHANNEL,)),
    )
    fields = rules_of(hp.protocol_common) | {"verifier_first": False}
    return Protocol(
        "merlin_arthur",
        agents,
        (MAIN_CHANNEL,),
        max_message_rounds=2,
        min_message_rounds=1,
        max_verifier_questions=0,
        stance_randomisable=False,
        **fields,
    )


def _verifier_alone(hp: Any, name: str) -> Protocol:
    """The shape of the protocols without experts: the verifier alone, one round."""
    fields = rules_of(hp.protocol_common) | {"verifier_first": True}
    return Protocol(
        name,
        (_verifier((MAIN_CHANNEL,)),),
        (MAIN_CHANNEL,),
        max_message_rounds=1,
        min_message_rounds=1,
        max_verifier_questions=0,
        stance_randomisable=False,
        **fields,
    )


def _solo_verifier(hp: Any) -> Protocol:
    """Solo verifier: no experts; the verifier judges the solution alone in a single round.

    The reference sets two rounds as a workaround for an array-shape bug and then terminates after
    round 0 anyway; we use one round, so "the last round" and "round 0" coincide and the generic
    termination rule needs no special case.
    """
    return _verifier_alone(hp, "solo_verifier")


def _pairwise(hp: Any) -> Protocol:
    """Pairwise: no experts; the verifier sees two solutions to one question, exactly one of
    them correct, and in a single round accepts Solution A (the first) or rejects it for
    Solution B (`nip_core.data.pairwise` shows every pair in both orders)."""
    return _verifier_alone(hp, "pairwise")


def _fill_in(hp: Any) -> Protocol:
    """Fill-in: no experts; the verifier sees one question's solution with the part where its
    two solutions differ cut out, and in a single round writes that part itself. Its verdict is
    the version its writing is nearer: accepting Solution A's, or rejecting it for Solution B's
    (`nip_core.data.pairwise.nearer_version`). It is told where to look, never shown either
    version, so no order can bias it."""
    return _verifier_alone(hp, "fill_in")


def _fill_in_choice(hp: Any) -> Protocol:
    """Fill-in by choice: the fill-in prompt, but the verifier's reply is one of the two
    versions of the missing part, drawn by its own probability of writing each (per token, at
    their mean length: `nip_core.lm_server.candidates`). A free writing is mostly a rewritten
    function or prose, near neither version; drawn from the two, the reply is always one of
    them, so every sampled pair contrasts the two versions. Neither version is shown in the
    prompt, so no order can bias it. Needs a provider that scores (our server, the dummy)."""
    return _verifier_alone(hp, "fill_in_choice")


_BUILDERS: dict[str, Callable[[Any], Protocol]] = {
    "nip": _nip,
    "adp": _adp,
    "debate": _debate,
    "merlin_arthur": _merlin_arthur,
    "mnip": _mnip,
    "solo_verifier": _solo_verifier,
    "pairwise": _pairwise,
    "fill_in": _fill_in,
    "fill_in_choice": _fill_in_choice,
}
PROTOCOL_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def _check(protocol: Protocol) -> None:
    """Clear errors for settings no schedule can honour."""
    name, low, high = protocol.name, protocol.min_message_rounds, protocol.max_message_rounds
    if high < 1:
        raise ValueError(f"{name}: max_message_rounds must be at least 1, got {high}")
    if not 1 <= low <= high:
        raise ValueError(f"{name}: min_message_rounds must lie in 1..{high}, got {low}")
    if protocol.force_guess is not None and protocol.force_guess not in FORCE_GUESS_VALUES:
        raise ValueError(
            f"force_guess must be one of {FORCE_GUESS_VALUES} or None, got {protocol.force_guess!r}"
        )
    validate_schedule(protocol)


def make_protocol(hyper_params: HyperParameters) -> Protocol:
    """The protocol named by `hyper_params.interaction_protocol`, validated.

    Reads `protocol_common` and, for multi-round protocols, `nip_protocol`, `debate_protocol` or
    `mnip_protocol`. ADP and Merlin-Arthur always have two rounds and the solo verifier one.
    """
    name = hyper_params.interaction_protocol
    if name not in _BUILDERS:
        raise ValueError(f"unknown interaction_protocol {name!r}; expected one of {PROTOCOL_NAMES}")
    protocol = _BUILDERS[name](hyper_params)
    _check(protocol)
    return replace(protocol, max_verifier_questions=count_verifier_rounds(protocol))
