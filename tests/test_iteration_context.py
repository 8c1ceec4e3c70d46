"""What an iteration derives from the configuration: groups, frozen agents, EI vs MALT."""

from __future__ import annotations

import pytest

from nip_core.parameters import HyperParameters, apply_overrides
from nip_core.run.iteration_context import build_context


def context(*overrides: str, iteration: int = 0, group_models=None):
    hp = apply_overrides(HyperParameters.construct_test_params(), list(overrides))
    return build_context(hp, "ctx-test", iteration, group_models)


def test_each_agent_is_its_own_group_by_default():
    ctx = context("interaction_protocol=debate")
    assert ctx.agent_names == ("prover0", "prover1", "verifier")
    assert ctx.groups == {
        "prover0": ("prover0",),
        "prover1": ("prover1",),
        "verifier": ("verifier",),
    }
    assert ctx.frozen_agents == frozenset()
    assert ctx.reward_midpoints == [0.5, 0.5, 0.0]
    assert ctx.reward_ranges == [(0.0, 1.0), (0.0, 1.0), (-1.0, 1.0)]


def test_shared_group_collects_agents_and_shares_models():
    ctx = context(
        "interaction_protocol=debate",
        "agents.prover0.shared_model_group=provers",
        "agents.prover1.shared_model_group=provers",
        group_models={"provers": "ft:provers:1"},
    )
    assert ctx.groups == {"provers": ("prover0", "prover1"), "verifier": ("verifier",)}
    assert ctx.models["prover0"] == ctx.models["prover1"] == "ft:provers:1"
    assert ctx.models["verifier"] == ctx.agent_params["verifier"].model_name
    assert ctx.group_models["provers"] == "ft:provers:1"


def test_group_members_must_agree():
    with pytest.raises(ValueError, match="differ in model_name"):
        context(
            "interaction_protocol=debate",
            "agents.prover0.shared_model_group=provers",
            "agents.prover1.shared_model_group=provers",
            "agents.prover1.model_name=other-model",
        )
    with pytest.raises(ValueError, match="the name of another agent"):
        context("interaction_protocol=debate", "agents.prover0.shared_model_group=verifier")


def test_frozen_groups_are_not_trainable():
    ctx = context("interaction_protocol=debate", "agents.prover0.freeze_agent=true")
    assert ctx.frozen_agents == {"prover0"}
    assert set(ctx.trainable_groups) == {"prover1", "verifier"}


@pytest.mark.parametrize(
    ("overrides", "iteration", "is_ei", "k"),
    [
        ((), 0, False, 2),
        (("pure_text_malt.num_responses_per_timestep=3",), 0, False, 3),
        (("trainer=pure_text_ei",), 5, True, 1),
        (("pure_text_malt.num_initial_ei_iterations=2",), 1, True, 1),
        (("pure_text_malt.num_initial_ei_iterations=2",), 2, False, 2),
    ],
)
def test_ei_and_malt_iterations(overrides, iteration, is_ei, k):
    ctx = context(*overrides, iteration=iteration)
    assert ctx.is_ei_iteration is is_ei
    assert ctx.num_responses_per_timestep == k
