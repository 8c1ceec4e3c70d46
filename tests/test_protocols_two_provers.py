"""Protocol tables for the two-expert protocols: debate, Merlin-Arthur and MNIP.

Rows and helpers are described in tests/test_protocols.py.
"""

from __future__ import annotations

import pytest

from tests.test_protocols import (
    NIP_R,
    ODD,
    RANDOM_STANCE,
    SHARED,
    V_M,
    VF_FALSE,
    Meta,
    Sched,
    Step,
    _common,
    _rows,
    _two,
    _verify,
)

V2, PP, P0, P1 = "V:c0,c1", "P0:c0 P1:c1", "P0:c0", "P1:c1"
EXPERTS = {"V": 0.0, "P0": 0.5, "P1": 0.5}


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
