"""Protocol behaviour outside the per-protocol tables: prompt channel order (also across
processes), agent specs, schedule validation and clear errors for bad input."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from nip_core.parameters import CommonProtocolParameters
from nip_core.protocols import (
    PROTOCOL_NAMES,
    AgentSpec,
    active_agents,
    active_channels,
    agent_stance,
    channel_order,
    make_protocol,
    reward_range,
    step_outcome,
    verifier_can_decide,
)
from nip_core.protocols.schedule import validate_schedule
from tests.test_protocols import ODD, _common, _hp, _two

REPO_ROOT = Path(__file__).resolve().parents[1]


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
