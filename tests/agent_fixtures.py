"""Small builders shared by the prompt, parsing and response tests (no I/O, no network)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nip_core.episode import ChannelMessage, Datapoint, Turn
from nip_core.parameters.agents import PureTextAgentParameters
from nip_core.parameters.hyper import HyperParameters
from nip_core.protocols import Protocol, make_protocol

# Code full of characters an HTML-escaping template engine would mangle.
SOLUTION = 'n = int(input())\nif 0 < n and n < 10 & 15:\n    print("sum:", n * (n + 1) // 2)'
QUESTION = "Read n (0 < n < 10) and print 'sum:' followed by 1 + 2 + ... + n."


# Its buggy twin, for the protocols that show a pair (the first line differs).
OTHER_SOLUTION = SOLUTION.replace("int(input())", "int(input()) - 1")


def make_datapoint(prover_stance: int = 1, y: int = 1, pair: bool = False) -> Datapoint:
    """The shared datapoint; `pair` adds its twin as the second solution."""
    other = OTHER_SOLUTION if pair else None
    return Datapoint(7, QUESTION, SOLUTION, y, prover_stance, other_solution=other)


def make_params(**overrides: Any) -> PureTextAgentParameters:
    return replace(PureTextAgentParameters(), **overrides)


def build_protocol(name: str, *, rounds: int | None = None, **common: Any) -> Protocol:
    """The named protocol with optional `max_message_rounds` and common-parameter overrides."""
    extra: dict[str, Any] = {}
    if rounds is not None:
        group = {"nip": "nip_protocol", "debate": "debate_protocol", "mnip": "mnip_protocol"}[name]
        extra[group] = {"max_message_rounds": rounds}
    hp = HyperParameters(
        scenario="code_validation",
        trainer="pure_text_malt",
        dataset="test",
        interaction_protocol=name,
        protocol_common=common,
        **extra,
    )
    return make_protocol(hp)


def turn(round: int, raw: dict[str, str], channels: dict[str, tuple[str, str]]) -> Turn:
    """A turn whose messages are given as {channel: (sender, content)}."""
    messages = tuple(ChannelMessage(agent, ch, text) for ch, (agent, text) in channels.items())
    return Turn(round=round, raw=raw, messages=messages)


def nip_episode() -> list[Turn]:
    """Four rounds of NIP (verifier first): question, answer, question, answer."""
    return [
        turn(
            0,
            {"verifier": "Question for Expert: q0"},
            {"main": ("verifier", "Question for Expert: q0")},
        ),
        turn(1, {"prover": "Answer: a1"}, {"main": ("prover", "Answer: a1")}),
        turn(
            2,
            {"verifier": "Question for Expert: q2"},
            {"main": ("verifier", "Question for Expert: q2")},
        ),
        turn(3, {"prover": "Answer: a3"}, {"main": ("prover", "Answer: a3")}),
    ]


def debate_episode() -> list[Turn]:
    """Two rounds of simultaneous debate: the verifier asks both, both experts answer."""
    ask = "Question for Expert_1: x1\nQuestion for Expert_2: x2"
    return [
        turn(
            0,
            {"verifier": ask},
            {
                "prover0_channel": ("verifier", "Question for Expert_1: x1"),
                "prover1_channel": ("verifier", "Question for Expert_2: x2"),
            },
        ),
        turn(
            1,
            {"prover0": "Answer: p0", "prover1": "Answer: p1"},
            {
                "prover0_channel": ("prover0", "Answer: p0"),
                "prover1_channel": ("prover1", "Answer: p1"),
            },
        ),
    ]
