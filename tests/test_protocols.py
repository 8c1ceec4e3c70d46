"""Table-driven tests for the interaction protocols, one table per protocol: nip, adp and
solo_verifier here; debate, merlin_arthur and mnip in test_protocols_two_provers.py.

Each row is one check on a protocol built from real `HyperParameters` with the given overrides:
- `Sched`: who is active on which channel in every round, for one schedule variant and seed;
- `Step`: the outcome of one round (decided / terminated and every agent's reward);
- `Meta`: round limits, verifier questions, reward ranges and mid-points.
Expected values are written out by hand from the protocol rules, never computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from nip_core.parameters import HyperParameters
from nip_core.protocols import (
    Protocol,
    active_agents,
    active_channels,
    is_agent_active,
    last_active_round,
    make_protocol,
    max_rounds_remaining_questions,
    reward_mid_point,
    reward_range,
    step_outcome,
)

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
EARLY_ENDS = {"early_decision_ends_episode": True}


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


def _two(group: str, **fields: object) -> dict[str, dict]:
    return {group: dict(fields)}


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
    (
        "early-decision-ends-episode",
        _common(EARLY_ENDS) | {"nip_protocol": {"min_message_rounds": 3}},
        Step(0, 1, 1, {"P": 0, "V": -1}, "terminated"),
    ),
    (
        "early-decision-ends-episode-odd",
        _common(ODD, EARLY_ENDS) | {"nip_protocol": {"min_message_rounds": 3}},
        Step(0, 0, 0, {"P": 0, "V": -5}, "terminated"),
    ),
    (
        "early-rule-question-goes-on",
        _common(EARLY_ENDS) | {"nip_protocol": {"min_message_rounds": 3}},
        Step(0, None, 1, {"P": 0, "V": 0}),
    ),
    (
        "early-rule-prover-round-goes-on",
        _common(EARLY_ENDS) | {"nip_protocol": {"min_message_rounds": 3}},
        Step(1, 1, 1, {"P": 0, "V": 0}),
    ),
    (
        "early-rule-decision-at-min-round",
        _common(EARLY_ENDS) | {"nip_protocol": {"min_message_rounds": 3}},
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
