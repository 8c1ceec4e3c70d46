"""Table-driven tests for the six interaction protocols (one table per protocol).

Each row is one check on a protocol built from real `HyperParameters` with the given overrides:
- `Sched`: who is active on which channel in every round, for one schedule variant and seed;
- `Step`: the outcome of one round (decided / terminated and every agent's reward);
- `Meta`: round limits, verifier questions, reward ranges and mid-points.
Expected values are written out by hand from the protocol rules, never computed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from nip_core.parameters import CommonProtocolParameters, HyperParameters
from nip_core.protocols import (
    PROTOCOL_NAMES,
    AgentSpec,
    Protocol,
    active_agents,
    active_channels,
    agent_stance,
    channel_order,
    is_agent_active,
    last_active_round,
    make_protocol,
    max_rounds_remaining_questions,
    reward_mid_point,
    reward_range,
    step_outcome,
    verifier_can_decide,
)
from nip_core.protocols.schedule import validate_schedule

REPO_ROOT = Path(__file__).resolve().parents[1]
AGENT = {"P": "prover", "P0": "prover0", "P1": "prover1", "V": "verifier"}
CHANNEL = {"m": "main", "c0": "prover0_channel", "c1": "prover1_channel"}
# Distinct reward numbers so that a mixed-up field shows up as a wrong value.
ODD = {
    "prover_reward": 2.0,
    "verifier_reward": 3.0,
    "verifier_incorrect_penalty": -4.0,
    "verifier_terminated_penalty": -5.0,
    "verifier_no_guess_reward": 0.25,
}
SHARED = {"shared_reward": True}
RANDOM_STANCE = {"randomize_prover_stance": True}


@dataclass(frozen=True)
class Sched:
    """rounds[r] lists "AGENT:ch,ch" for every active agent, e.g. "P0:c0 P1:c1"."""

    rounds: tuple[str, ...]
    seed: int = 0


@dataclass(frozen=True)
class Step:
    """`rewards` uses the AGENT abbreviations; "end" is "", "done" or "terminated"."""

    round: int
    decision: int | None
    y: int
    rewards: dict[str, float]
    end: str = ""
    stance: int = 1
    seed: int = 0


@dataclass(frozen=True)
class Meta:
    max_rounds: int
    min_rounds: int
    questions: int
    ranges: dict[str, tuple[float, float]]
    mid: dict[str, float]
    questions_left: tuple[int, ...] = ()
    last_verifier_round: int | None = None
    stance_randomisable: bool | None = None


def _hp(protocol: str, groups: dict[str, dict]) -> HyperParameters:
    return HyperParameters(
        scenario="code_validation",
        trainer="pure_text_malt",
        dataset="humaneval-buggy",
        interaction_protocol=protocol,
        **groups,
    )


def _parse_round(text: str) -> dict[str, tuple[str, ...]]:
    active = {}
    for item in text.split():
        agent, channels = item.split(":")
        active[AGENT[agent]] = tuple(CHANNEL[c] for c in channels.split(","))
    return active


def _check_sched(protocol: Protocol, row: Sched) -> None:
    assert protocol.max_message_rounds == len(row.rounds)
    for round, text in enumerate(row.rounds):
        expected = _parse_round(text)
        assert set(active_agents(protocol, round, row.seed)) == set(expected), round
        assert list(active_agents(protocol, round, row.seed)) == [
            a for a in protocol.agent_names if a in expected
        ]
        for agent in protocol.agent_names:
            channels = active_channels(protocol, agent, round, row.seed)
            assert channels == expected.get(agent, ()), (round, agent)
            assert is_agent_active(protocol, agent, round, row.seed) == (agent in expected)
            assert set(channels) <= set(protocol.agent(agent).visible_channels)


def _check_step(protocol: Protocol, row: Step) -> None:
    out = step_outcome(protocol, row.round, row.decision, row.y, row.stance, row.seed)
    assert out.rewards == {AGENT[a]: r for a, r in row.rewards.items()}
    assert list(out.rewards) == list(protocol.agent_names)
    assert (out.decided, out.done, out.terminated) == (
        row.end == "done",
        row.end == "done",
        row.end == "terminated",
    )
    assert out.ended == (row.end != "")


def _check_meta(protocol: Protocol, row: Meta) -> None:
    assert (protocol.max_message_rounds, protocol.min_message_rounds) == (
        row.max_rounds,
        row.min_rounds,
    )
    assert protocol.max_verifier_questions == row.questions
    for abbrev, expected in row.ranges.items():
        assert reward_range(protocol, AGENT[abbrev]) == expected, abbrev
    for abbrev, expected in row.mid.items():
        assert reward_mid_point(protocol, AGENT[abbrev]) == expected, abbrev
    if row.questions_left:
        left = [max_rounds_remaining_questions(protocol, r) for r in range(row.max_rounds)]
        assert tuple(left) == row.questions_left
    if row.last_verifier_round is not None:
        assert last_active_round(protocol, "verifier", 0) == row.last_verifier_round
    if row.stance_randomisable is not None:
        assert protocol.stance_randomisable == row.stance_randomisable


def _verify(name: str, groups: dict[str, dict], check: Sched | Step | Meta) -> None:
    protocol = make_protocol(_hp(name, groups))
    assert protocol.name == name
    match check:
        case Sched():
            _check_sched(protocol, check)
        case Step():
            _check_step(protocol, check)
        case Meta():
            _check_meta(protocol, check)


def _rows(*rows: tuple) -> list:
    return [pytest.param(groups, check, id=label) for label, groups, check in rows]


def _common(*parts: dict) -> dict[str, dict]:
    merged: dict = {}
    for part in parts:
        merged |= part
    return {"protocol_common": merged}


VF_FALSE = {"verifier_first": False}
NIP_R = {"nip_protocol": {"max_message_rounds": 5}}

V_M, P_M = "V:m", "P:m"
NIP_ROWS = _rows(
    ("sched-vf-R8", {}, Sched((V_M, P_M) * 4)),
    ("sched-pf-R5", _common(VF_FALSE) | NIP_R, Sched((P_M, V_M, P_M, V_M, P_M))),
    ("sched-vf-R5", NIP_R, Sched((V_M, P_M, V_M, P_M, V_M), seed=3)),
    (
        "meta-default",
        {},
        Meta(
            8,
            1,
            4,
            {"V": (-1, 1), "P": (0, 1)},
            {"V": 0.0, "P": 0.5},
            (3, 2, 2, 1, 1, 0, 0, 0),
            6,
            True,
        ),
    ),
    (
        "meta-pf-R5",
        _common(VF_FALSE) | NIP_R,
        Meta(5, 1, 2, {"V": (-1, 1)}, {"P": 0.5}, (1, 1, 0, 0, 0), 3),
    ),
    ("meta-odd", _common(ODD), Meta(8, 1, 4, {"V": (-5, 3), "P": (0, 2)}, {"V": -0.5, "P": 1.0})),
    (
        "meta-odd-shared",
        _common(ODD, SHARED),
        Meta(8, 1, 4, {"V": (-5, 3), "P": (-5, 3)}, {"V": -0.5, "P": -0.5}),
    ),
    (
        "meta-min3-R6",
        {"nip_protocol": {"max_message_rounds": 6, "min_message_rounds": 3}},
        Meta(6, 3, 3, {}, {}),
    ),
    ("accept-y1", {}, Step(2, 1, 1, {"P": 1, "V": 1}, "done")),
    ("accept-y0", {}, Step(2, 1, 0, {"P": 1, "V": -1}, "done")),
    ("reject-y0", {}, Step(4, 0, 0, {"P": 0, "V": 1}, "done")),
    ("reject-y1", {}, Step(0, 0, 1, {"P": 0, "V": -1}, "done")),
    ("rand-stance0-reject-y0", _common(RANDOM_STANCE), Step(6, 0, 0, {"P": 1, "V": 1}, "done", 0)),
    ("rand-stance0-accept-y1", _common(RANDOM_STANCE), Step(6, 1, 1, {"P": 0, "V": 1}, "done", 0)),
    ("rand-stance1-accept-y0", _common(RANDOM_STANCE), Step(2, 1, 0, {"P": 1, "V": -1}, "done", 1)),
    ("fixed-stance0-reject-y0", {}, Step(2, 0, 0, {"P": 0, "V": 1}, "done", 0)),
    ("shared-accept-y0", _common(SHARED), Step(2, 1, 0, {"P": -1, "V": -1}, "done")),
    ("shared-reject-y0", _common(SHARED), Step(2, 0, 0, {"P": 1, "V": 1}, "done")),
    ("odd-accept-y1", _common(ODD), Step(2, 1, 1, {"P": 2, "V": 3}, "done")),
    ("odd-accept-y0", _common(ODD), Step(2, 1, 0, {"P": 2, "V": -4}, "done")),
    ("odd-reject-y1", _common(ODD), Step(2, 0, 1, {"P": 0, "V": -4}, "done")),
    ("odd-shared-accept-y0", _common(ODD, SHARED), Step(2, 1, 0, {"P": -4, "V": -4}, "done")),
    ("terminated", {}, Step(7, None, 1, {"P": 0, "V": -1}, "terminated")),
    ("odd-terminated", _common(ODD), Step(7, None, 0, {"P": 0, "V": -5}, "terminated")),
    (
        "odd-shared-terminated",
        _common(ODD, SHARED),
        Step(7, None, 0, {"P": -5, "V": -5}, "terminated"),
    ),
    ("decision-in-last-prover-round", {}, Step(7, 1, 1, {"P": 0, "V": -1}, "terminated")),
    ("decision-in-prover-round", _common(ODD), Step(3, 1, 1, {"P": 0, "V": 0})),
    (
        "vf-R5-last-verifier-round",
        _common(ODD) | NIP_R,
        Step(4, None, 1, {"P": 0, "V": -5}, "terminated"),
    ),
    ("no-guess", _common(ODD), Step(2, None, 1, {"P": 0, "V": 0.25})),
    ("no-guess-shared", _common(ODD, SHARED), Step(4, None, 1, {"P": 0.25, "V": 0.25})),
    ("prover-round-no-decision", _common(ODD), Step(1, None, 1, {"P": 0, "V": 0})),
    (
        "early-decision-ignored",
        {"nip_protocol": {"min_message_rounds": 3}},
        Step(0, 1, 1, {"P": 0, "V": 0}),
    ),
    (
        "early-decision-ignored-no-guess",
        _common(ODD) | {"nip_protocol": {"min_message_rounds": 3}},
        Step(0, 0, 0, {"P": 0, "V": 0.25}),
    ),
    (
        "decision-at-min-round",
        {"nip_protocol": {"min_message_rounds": 3}},
        Step(2, 1, 1, {"P": 1, "V": 1}, "done"),
    ),
    ("force-zero", _common({"force_guess": "zero"}), Step(0, None, 1, {"P": 0, "V": -1}, "done")),
    ("force-one", _common({"force_guess": "one"}), Step(0, None, 0, {"P": 1, "V": -1}, "done")),
    ("force-y-overrides", _common({"force_guess": "y"}), Step(0, 0, 1, {"P": 1, "V": 1}, "done")),
    ("force-y-y0", _common({"force_guess": "y"}), Step(2, 1, 0, {"P": 0, "V": 1}, "done")),
    ("force-in-prover-round", _common({"force_guess": "one"}), Step(1, None, 1, {"P": 0, "V": 0})),
    (
        "force-before-min-round",
        _common({"force_guess": "one"}) | {"nip_protocol": {"min_message_rounds": 3}},
        Step(0, None, 1, {"P": 0, "V": 0}),
    ),
)


@pytest.mark.parametrize(("groups", "check"), NIP_ROWS)
def test_nip(groups: dict, check: Sched | Step | Meta) -> None:
    _verify("nip", groups, check)


ADP_ROWS = _rows(
    ("sched", {}, Sched((P_M, V_M))),
    ("sched-ignores-verifier-first", _common({"verifier_first": True}) | NIP_R, Sched((P_M, V_M))),
    (
        "meta",
        NIP_R,
        Meta(2, 1, 1, {"V": (-1, 1), "P": (0, 1)}, {"V": 0.0, "P": 0.5}, (0, 0), 1, True),
    ),
    ("meta-odd-shared", _common(ODD, SHARED), Meta(2, 1, 1, {"P": (-5, 3)}, {"P": -0.5})),
    ("accept-y1", {}, Step(1, 1, 1, {"P": 1, "V": 1}, "done")),
    ("accept-y0", {}, Step(1, 1, 0, {"P": 1, "V": -1}, "done")),
    ("reject-y0", {}, Step(1, 0, 0, {"P": 0, "V": 1}, "done")),
    ("reject-y1", {}, Step(1, 0, 1, {"P": 0, "V": -1}, "done")),
    ("rand-stance0-reject-y0", _common(RANDOM_STANCE), Step(1, 0, 0, {"P": 1, "V": 1}, "done", 0)),
    ("shared-accept-y0", _common(SHARED), Step(1, 1, 0, {"P": -1, "V": -1}, "done")),
    ("terminated", {}, Step(1, None, 1, {"P": 0, "V": -1}, "terminated")),
    ("odd-terminated", _common(ODD), Step(1, None, 1, {"P": 0, "V": -5}, "terminated")),
    ("decision-in-prover-round", _common(ODD), Step(0, 1, 1, {"P": 0, "V": 0})),
    ("force-zero", _common({"force_guess": "zero"}), Step(1, None, 0, {"P": 0, "V": 1}, "done")),
    ("force-in-prover-round", _common({"force_guess": "y"}), Step(0, None, 0, {"P": 0, "V": 0})),
)


@pytest.mark.parametrize(("groups", "check"), ADP_ROWS)
def test_adp(groups: dict, check: Sched | Step | Meta) -> None:
    _verify("adp", groups, check)


V2, PP, P0, P1 = "V:c0,c1", "P0:c0 P1:c1", "P0:c0", "P1:c1"
EXPERTS = {"V": 0.0, "P0": 0.5, "P1": 0.5}


def _two(group: str, **fields: object) -> dict[str, dict]:
    return {group: dict(fields)}


def _schedule_rows(group: str) -> list[tuple]:
    """The four (verifier_first x sequential) schedules plus prover1-first variants."""
    pf = _common(VF_FALSE)
    return [
        ("sched-vf-sim-R4", _two(group, max_message_rounds=4), Sched((V2, PP, V2, PP))),
        ("sched-vf-sim-R8", {}, Sched((V2, PP) * 4, seed=5)),
        (
            "sched-vf-seq-p0-R7",
            _two(group, max_message_rounds=7, sequential=True),
            Sched((V2, P0, P1, V2, P0, P1, V2)),
        ),
        (
            "sched-vf-seq-p1-R6",
            _two(group, max_message_rounds=6, sequential=True, prover0_first=False),
            Sched((V2, P1, P0, V2, P1, P0)),
        ),
        ("sched-pf-sim-R4", pf | _two(group, max_message_rounds=4), Sched((PP, V2, PP, V2))),
        (
            "sched-pf-sim-p1-R2",
            pf | _two(group, max_message_rounds=2, prover0_first=False),
            Sched((PP, V2)),
        ),
        (
            "sched-pf-seq-p0-R6",
            pf | _two(group, max_message_rounds=6, sequential=True),
            Sched((P0, P1, V2, P0, P1, V2)),
        ),
        (
            "sched-pf-seq-p1-R3",
            pf | _two(group, max_message_rounds=3, sequential=True, prover0_first=False),
            Sched((P1, P0, V2)),
        ),
    ]


def _two_prover_meta_rows(group: str, randomisable: bool) -> list[tuple]:
    ranges = {"V": (-1, 1), "P0": (0, 1), "P1": (0, 1)}
    return [
        (
            "meta-default",
            {},
            Meta(8, 1, 4, ranges, EXPERTS, (3, 2, 2, 1, 1, 0, 0, 0), 6, randomisable),
        ),
        (
            "meta-vf-seq-R7",
            _two(group, max_message_rounds=7, sequential=True),
            Meta(7, 1, 3, ranges, EXPERTS, (2, 1, 1, 1, 0, 0, 0), 6),
        ),
        (
            "meta-pf-seq-R6",
            _common(VF_FALSE) | _two(group, max_message_rounds=6, sequential=True),
            Meta(6, 1, 2, ranges, EXPERTS, (1, 1, 1, 0, 0, 0), 5),
        ),
        ("meta-min2", _two(group, min_message_rounds=2), Meta(8, 2, 4, {}, {})),
        (
            "meta-odd-shared",
            _common(ODD, SHARED),
            Meta(8, 1, 4, {"V": (-5, 3), "P0": (-5, 3), "P1": (-5, 3)}, {"P0": -0.5, "P1": -0.5}),
        ),
        (
            "meta-odd",
            _common(ODD),
            Meta(8, 1, 4, {"P0": (0, 2), "P1": (0, 2)}, {"P0": 1.0, "V": -0.5}),
        ),
    ]


SEQ7 = _two("debate_protocol", max_message_rounds=7, sequential=True)
DEBATE_ROWS = _rows(
    *_schedule_rows("debate_protocol"),
    *_two_prover_meta_rows("debate_protocol", randomisable=False),
    ("accept-y1", {}, Step(2, 1, 1, {"P0": 0, "P1": 1, "V": 1}, "done")),
    ("reject-y1", {}, Step(2, 0, 1, {"P0": 1, "P1": 0, "V": -1}, "done")),
    ("reject-y0", {}, Step(0, 0, 0, {"P0": 1, "P1": 0, "V": 1}, "done")),
    ("accept-y0", {}, Step(6, 1, 0, {"P0": 0, "P1": 1, "V": -1}, "done")),
    (
        "rand-stance-ignored",
        _common(RANDOM_STANCE),
        Step(2, 1, 1, {"P0": 0, "P1": 1, "V": 1}, "done", 0),
    ),
    ("shared-accept-y0", _common(SHARED), Step(2, 1, 0, {"P0": -1, "P1": -1, "V": -1}, "done")),
    (
        "odd-shared-reject-y0",
        _common(ODD, SHARED),
        Step(2, 0, 0, {"P0": 3, "P1": 3, "V": 3}, "done"),
    ),
    ("odd-accept-y1", _common(ODD), Step(2, 1, 1, {"P0": 0, "P1": 2, "V": 3}, "done")),
    ("terminated", {}, Step(7, None, 1, {"P0": 0, "P1": 0, "V": -1}, "terminated")),
    (
        "odd-shared-terminated",
        _common(ODD, SHARED),
        Step(7, 1, 1, {"P0": -5, "P1": -5, "V": -5}, "terminated"),
    ),
    (
        "seq-terminated-in-verifier-round",
        _common(ODD) | SEQ7,
        Step(6, None, 1, {"P0": 0, "P1": 0, "V": -5}, "terminated"),
    ),
    ("seq-decision-in-last-round", SEQ7, Step(6, 0, 1, {"P0": 1, "P1": 0, "V": -1}, "done")),
    (
        "seq-decision-in-prover-round",
        _common(ODD) | SEQ7,
        Step(1, 1, 1, {"P0": 0, "P1": 0, "V": 0}),
    ),
    ("no-guess", _common(ODD), Step(4, None, 1, {"P0": 0, "P1": 0, "V": 0.25})),
    (
        "early-decision-ignored",
        _two("debate_protocol", min_message_rounds=3),
        Step(0, 0, 0, {"P0": 0, "P1": 0, "V": 0}),
    ),
    (
        "decision-at-min-round",
        _two("debate_protocol", min_message_rounds=3),
        Step(2, 0, 0, {"P0": 1, "P1": 0, "V": 1}, "done"),
    ),
    (
        "force-y",
        _common({"force_guess": "y"}),
        Step(0, None, 1, {"P0": 0, "P1": 1, "V": 1}, "done"),
    ),
)


@pytest.mark.parametrize(("groups", "check"), DEBATE_ROWS)
def test_debate(groups: dict, check: Sched | Step | Meta) -> None:
    _verify("debate", groups, check)


MA_ROWS = _rows(
    ("sched-seed0", {}, Sched(("P0:m", V_M), seed=0)),
    ("sched-seed7", {}, Sched(("P1:m", V_M), seed=7)),
    ("sched-seed2", NIP_R, Sched(("P0:m", V_M), seed=2)),
    ("sched-seed-minus3", _common(VF_FALSE), Sched(("P1:m", V_M), seed=-3)),
    ("sched-seed-large-even", {}, Sched(("P0:m", V_M), seed=2**40)),
    (
        "meta",
        NIP_R,
        Meta(2, 1, 1, {"V": (-1, 1), "P0": (0, 1), "P1": (0, 1)}, EXPERTS, (0, 0), 1, False),
    ),
    ("meta-odd-shared", _common(ODD, SHARED), Meta(2, 1, 1, {"P1": (-5, 3)}, {"P0": -0.5})),
    ("accept-y1", {}, Step(1, 1, 1, {"P0": 0, "P1": 1, "V": 1}, "done", seed=0)),
    ("reject-y0", {}, Step(1, 0, 0, {"P0": 1, "P1": 0, "V": 1}, "done", seed=1)),
    ("accept-y0", {}, Step(1, 1, 0, {"P0": 0, "P1": 1, "V": -1}, "done", seed=1)),
    ("reject-y1", {}, Step(1, 0, 1, {"P0": 1, "P1": 0, "V": -1}, "done", seed=4)),
    (
        "rand-stance-ignored",
        _common(RANDOM_STANCE),
        Step(1, 1, 1, {"P0": 0, "P1": 1, "V": 1}, "done", 0),
    ),
    (
        "odd-shared-accept-y0",
        _common(ODD, SHARED),
        Step(1, 1, 0, {"P0": -4, "P1": -4, "V": -4}, "done"),
    ),
    ("terminated", {}, Step(1, None, 1, {"P0": 0, "P1": 0, "V": -1}, "terminated")),
    (
        "odd-terminated",
        _common(ODD),
        Step(1, None, 0, {"P0": 0, "P1": 0, "V": -5}, "terminated", seed=3),
    ),
    ("decision-in-prover-round", _common(ODD), Step(0, 1, 1, {"P0": 0, "P1": 0, "V": 0}, seed=1)),
    (
        "force-one",
        _common({"force_guess": "one"}),
        Step(1, None, 1, {"P0": 0, "P1": 1, "V": 1}, "done", seed=5),
    ),
)


@pytest.mark.parametrize(("groups", "check"), MA_ROWS)
def test_merlin_arthur(groups: dict, check: Sched | Step | Meta) -> None:
    _verify("merlin_arthur", groups, check)


MNIP_ROWS = _rows(
    *_schedule_rows("mnip_protocol"),
    *_two_prover_meta_rows("mnip_protocol", randomisable=True),
    ("accept-y1", {}, Step(2, 1, 1, {"P0": 1, "P1": 1, "V": 1}, "done")),
    ("reject-y0", {}, Step(2, 0, 0, {"P0": 0, "P1": 0, "V": 1}, "done")),
    ("accept-y0", {}, Step(4, 1, 0, {"P0": 1, "P1": 1, "V": -1}, "done")),
    ("reject-y1", {}, Step(0, 0, 1, {"P0": 0, "P1": 0, "V": -1}, "done")),
    (
        "rand-stance0-reject-y0",
        _common(RANDOM_STANCE),
        Step(2, 0, 0, {"P0": 1, "P1": 1, "V": 1}, "done", 0),
    ),
    (
        "rand-stance0-accept-y1",
        _common(RANDOM_STANCE),
        Step(2, 1, 1, {"P0": 0, "P1": 0, "V": 1}, "done", 0),
    ),
    ("fixed-stance0-reject-y0", {}, Step(2, 0, 0, {"P0": 0, "P1": 0, "V": 1}, "done", 0)),
    ("shared-accept-y0", _common(SHARED), Step(2, 1, 0, {"P0": -1, "P1": -1, "V": -1}, "done")),
    ("odd-accept-y0", _common(ODD), Step(2, 1, 0, {"P0": 2, "P1": 2, "V": -4}, "done")),
    ("terminated", {}, Step(7, None, 1, {"P0": 0, "P1": 0, "V": -1}, "terminated")),
    (
        "odd-shared-terminated",
        _common(ODD, SHARED),
        Step(7, None, 1, {"P0": -5, "P1": -5, "V": -5}, "terminated"),
    ),
    ("no-guess", _common(ODD), Step(2, None, 1, {"P0": 0, "P1": 0, "V": 0.25})),
    ("decision-in-prover-round", {}, Step(1, 1, 1, {"P0": 0, "P1": 0, "V": 0})),
    (
        "early-decision-ignored",
        _two("mnip_protocol", min_message_rounds=2),
        Step(0, 1, 1, {"P0": 0, "P1": 0, "V": 0}),
    ),
    (
        "force-zero",
        _common({"force_guess": "zero"}),
        Step(0, None, 0, {"P0": 0, "P1": 0, "V": 1}, "done"),
    ),
)


@pytest.mark.parametrize(("groups", "check"), MNIP_ROWS)
def test_mnip(groups: dict, check: Sched | Step | Meta) -> None:
    _verify("mnip", groups, check)


SOLO_ROWS = _rows(
    ("sched", {}, Sched((V_M,))),
    ("sched-ignores-nip-rounds", NIP_R | _common(VF_FALSE), Sched((V_M,), seed=9)),
    ("meta", NIP_R, Meta(1, 1, 1, {"V": (-1, 1)}, {"V": 0.0}, (0,), 0, False)),
    ("meta-odd", _common(ODD), Meta(1, 1, 1, {"V": (-5, 3)}, {"V": -0.5})),
    ("accept-y1", {}, Step(0, 1, 1, {"V": 1}, "done")),
    ("reject-y1", {}, Step(0, 0, 1, {"V": -1}, "done")),
    ("reject-y0", {}, Step(0, 0, 0, {"V": 1}, "done")),
    ("accept-y0", {}, Step(0, 1, 0, {"V": -1}, "done")),
    ("no-decision-terminates", {}, Step(0, None, 1, {"V": -1}, "terminated")),
    ("odd-no-decision-terminates", _common(ODD), Step(0, None, 1, {"V": -5}, "terminated")),
    ("shared-has-no-provers", _common(SHARED), Step(0, 1, 1, {"V": 1}, "done")),
    (
        "min-rounds-ignored",
        {"nip_protocol": {"min_message_rounds": 3}},
        Step(0, 0, 0, {"V": 1}, "done"),
    ),
    ("force-y", _common({"force_guess": "y"}), Step(0, None, 0, {"V": 1}, "done")),
)


@pytest.mark.parametrize(("groups", "check"), SOLO_ROWS)
def test_solo_verifier(groups: dict, check: Sched | Step | Meta) -> None:
    _verify("solo_verifier", groups, check)


C0, C1 = "prover0_channel", "prover1_channel"


def test_channel_order_per_agent() -> None:
    """Provers see the opponent first; the verifier's order is fixed unless randomised."""
    fixed = make_protocol(_hp("debate", _two("debate_protocol", randomize_channel_order=False)))
    shuffled = make_protocol(_hp("debate", {}))
    mnip = make_protocol(_hp("mnip", {}))
    nip = make_protocol(_hp("nip", {}))
    for round in range(8):
        assert channel_order(fixed, "verifier", round, 3) == (C0, C1)
        assert channel_order(shuffled, "prover0", round, 3) == (C1, C0)
        assert channel_order(shuffled, "prover1", round, 3) == (C0, C1)
        assert channel_order(mnip, "prover0", round, 3) == (C0,)
        assert channel_order(mnip, "prover1", round, 3) == (C1,)
        assert channel_order(nip, "verifier", round, 3) == ("main",)
        assert sorted(channel_order(shuffled, "verifier", round, 3)) == [C0, C1]
    orders = {channel_order(shuffled, "verifier", r, s) for s in range(4) for r in range(8)}
    assert orders == {(C0, C1), (C1, C0)}
    # The order is a function of (seed, round) only: mnip and debate agree.
    assert all(
        channel_order(mnip, "verifier", r, s) == channel_order(shuffled, "verifier", r, s)
        for s in range(4)
        for r in range(8)
    )


_ORDER_SCRIPT = """
from nip_core.parameters import HyperParameters
from nip_core.protocols import channel_order, make_protocol
hp = HyperParameters(scenario="code_validation", trainer="pure_text_malt",
                     dataset="humaneval-buggy", interaction_protocol="debate")
p = make_protocol(hp)
print([channel_order(p, "verifier", r, s) for s in range(6) for r in range(8)])
"""


def test_channel_order_is_the_same_in_every_process() -> None:
    """Python's string hash is salted per process; the verifier's order must not depend on it."""
    outputs = set()
    for hash_seed in ("1", "2", "random"):
        env = os.environ | {"PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", _ORDER_SCRIPT],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        outputs.add(done.stdout.strip())
    protocol = make_protocol(_hp("debate", {}))
    here = [channel_order(protocol, "verifier", r, s) for s in range(6) for r in range(8)]
    assert outputs == {str(here)}


def test_same_config_gives_equal_hashable_protocols() -> None:
    first = make_protocol(_hp("debate", _common(ODD)))
    assert first == make_protocol(_hp("debate", _common(ODD)))
    assert hash(first) == hash(make_protocol(_hp("debate", _common(ODD))))
    assert first != make_protocol(_hp("debate", {}))
    assert first.agent_names == ("prover0", "prover1", "verifier")
    assert first.verifier_name == "verifier"
    assert first.agent("verifier").response_headers == {
        C0: "Question for Expert_1:",
        C1: "Question for Expert_2:",
    }


@pytest.mark.parametrize(
    ("name", "human_names", "anonymous", "stances", "last_round_message"),
    [
        ("nip", ("Expert", "Verifier"), False, (1,), True),
        ("adp", ("Expert", "Verifier"), False, (1,), False),
        ("debate", ("Expert_1", "Expert_2", "Verifier"), False, (0, 1), True),
        ("merlin_arthur", ("Expert_1", "Expert_2", "Verifier"), True, (0, 1), False),
        ("mnip", ("Expert_1", "Expert_2", "Verifier"), False, (1, 1), True),
        ("solo_verifier", ("Verifier",), False, (), False),
    ],
)
def test_agent_specs(
    name: str,
    human_names: tuple[str, ...],
    anonymous: bool,
    stances: tuple[int, ...],
    last_round_message: bool,
) -> None:
    protocol = make_protocol(_hp(name, {}))
    assert tuple(a.human_name for a in protocol.agents) == human_names
    provers = [protocol.agent(n) for n in protocol.prover_names]
    assert all(p.anonymous == anonymous for p in provers)
    assert not protocol.agent("verifier").anonymous
    assert tuple(agent_stance(protocol, p.name, 0) for p in provers) == stances
    verifier_message = protocol.agent("verifier").last_round_message
    assert (verifier_message is not None) == last_round_message


def test_mnip_provers_cannot_see_each_other() -> None:
    protocol = make_protocol(_hp("mnip", {}))
    assert protocol.agent("prover0").visible_channels == (C0,)
    assert protocol.agent("prover1").visible_channels == (C1,)
    assert protocol.agent("verifier").visible_channels == (C0, C1)
    assert make_protocol(_hp("debate", {})).agent("prover0").visible_channels == (C0, C1)


def test_verifier_can_decide_from_min_round() -> None:
    protocol = make_protocol(_hp("nip", {"nip_protocol": {"min_message_rounds": 4}}))
    decidable = [verifier_can_decide(protocol, r, 0) for r in range(8)]
    assert decidable == [False, False, False, False, True, False, True, False]


def test_schedule_validation_rejects_invisible_and_shared_channels() -> None:
    mnip = make_protocol(_hp("mnip", {}))
    blind = AgentSpec("prover0", "Expert_1", False, (C1,))
    with pytest.raises(ValueError, match="'prover0' would write to channel 'prover0_channel'"):
        validate_schedule(replace(mnip, agents=(blind, *mnip.agents[1:])))
    nip = make_protocol(_hp("nip", {}))
    with pytest.raises(ValueError, match="cannot see it"):
        validate_schedule(
            replace(nip, agents=(nip.agents[0], AgentSpec("verifier", "V", True, ())))
        )
    second_prover = AgentSpec("prover0", "Expert_2", False, ("main",))
    crowded = replace(nip, agents=(nip.agents[0], second_prover, nip.agents[1]))
    with pytest.raises(ValueError, match="'prover' and 'prover0' both write to channel 'main'"):
        validate_schedule(crowded)
    debate = make_protocol(_hp("debate", {}))
    with pytest.raises(ValueError, match="unknown protocol"):
        validate_schedule(replace(debate, name="chess"))


def test_bad_inputs_give_clear_errors() -> None:
    protocol = make_protocol(_hp("nip", {}))
    with pytest.raises(ValueError, match="interaction_protocol 'bogus'"):
        make_protocol(SimpleNamespace(interaction_protocol="bogus"))
    with pytest.raises(ValueError, match="no agent 'prover0'.*'prover', 'verifier'"):
        active_channels(protocol, "prover0", 0, 0)
    for round in (-1, 8):
        with pytest.raises(ValueError, match=f"round {round} is outside"):
            step_outcome(protocol, round, 1, 1, 1, 0)
    with pytest.raises(ValueError, match="decision must be"):
        step_outcome(protocol, 0, 2, 1, 1, 0)
    with pytest.raises(ValueError, match="y must be"):
        step_outcome(protocol, 0, 1, 3, 1, 0)
    with pytest.raises(ValueError, match="prover_stance must be"):
        agent_stance(protocol, "prover", -1)
    with pytest.raises(ValueError, match="verifier, which argues no stance"):
        agent_stance(protocol, "verifier", 1)
    with pytest.raises(ValueError, match="no agent 'judge'"):
        reward_range(protocol, "judge")


def _raw_params(common: dict, nip_rounds: tuple[int, int]) -> SimpleNamespace:
    """Unvalidated stand-in for HyperParameters, to reach make_protocol's own checks."""
    defaults = vars(CommonProtocolParameters())
    rounds = SimpleNamespace(max_message_rounds=nip_rounds[0], min_message_rounds=nip_rounds[1])
    return SimpleNamespace(
        interaction_protocol="nip",
        protocol_common=SimpleNamespace(**(defaults | common)),
        nip_protocol=rounds,
    )


@pytest.mark.parametrize(
    ("common", "nip_rounds", "message"),
    [
        ({}, (4, 5), "min_message_rounds must lie in 1..4, got 5"),
        ({}, (0, 1), "max_message_rounds must be at least 1, got 0"),
        ({}, (4, 0), "min_message_rounds must lie in 1..4, got 0"),
        ({"force_guess": "maybe"}, (4, 1), "force_guess must be one of"),
    ],
)
def test_impossible_settings_are_rejected(
    common: dict, nip_rounds: tuple[int, int], message: str
) -> None:
    make_protocol(_raw_params({}, (4, 1)))  # the stand-in itself is acceptable
    with pytest.raises(ValueError, match=re.escape(message)):
        make_protocol(_raw_params(common, nip_rounds))


@pytest.mark.parametrize("name", PROTOCOL_NAMES)
def test_every_round_has_an_actor_and_the_episode_ends(name: str) -> None:
    """Playing with no decisions terminates in the last round and never earlier."""
    protocol = make_protocol(_hp(name, {}))
    for seed in (0, 1):
        ends = []
        for round in range(protocol.max_message_rounds):
            assert active_agents(protocol, round, seed)
            ends.append(step_outcome(protocol, round, None, 1, 1, seed).terminated)
        assert ends == [False] * (protocol.max_message_rounds - 1) + [True]
