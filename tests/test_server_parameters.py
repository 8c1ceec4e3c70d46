"""The run's `server` section: set once, moved there from agents' settings (nip's and ours)."""

from __future__ import annotations

import pytest

from nip_core.parameters import HyperParameters, PureTextAgentParameters, apply_overrides


def config(**agents) -> dict:
    base = {
        "scenario": "code_validation",
        "trainer": "pure_text_malt",
        "dataset": "humaneval-buggy",
    }
    return {**base, "agents": agents}


def test_agents_server_settings_move_to_the_server_section():
    hp = HyperParameters.from_dict(
        config(
            _default={"model_provider": "SelfHosted", "language_model_server_engine": "vllm"},
            verifier={"vllm_server_port": 8123, "language_model_server_shared": False},
        )
    )
    assert (hp.server.engine, hp.server.vllm_port, hp.server.shared) == ("vllm", 8123, False)
    assert hp.agents["verifier"] == PureTextAgentParameters()  # nothing else was set
    assert HyperParameters.from_dict(hp.to_dict()) == hp


def test_agents_asking_for_different_server_settings_are_refused_by_name():
    with pytest.raises(
        ValueError, match=r"agents\.verifier\.vllm_server_port=9000.*server\.vllm_port"
    ):
        HyperParameters.from_dict(
            config(prover={"vllm_server_port": 8123}, verifier={"vllm_server_port": 9000})
        )
    clash = {
        **config(_default={"language_model_server_engine": "vllm"}),
        "server": {"engine": "transformers"},
    }
    with pytest.raises(ValueError, match="server.engine='transformers'"):
        HyperParameters.from_dict(clash)


def test_an_override_of_a_moved_setting_names_its_new_place():
    hp = HyperParameters.construct_test_params()
    with pytest.raises(KeyError, match="set server.engine"):
        apply_overrides(hp, ["agents._default.language_model_server_engine=vllm"])
    assert apply_overrides(hp, ["server.engine=vllm"]).server.engine == "vllm"


def test_an_agent_dict_with_a_server_setting_beyond_its_default_is_refused():
    assert (
        PureTextAgentParameters.from_dict({"vllm_enforce_eager": False})
        == PureTextAgentParameters()
    )
    with pytest.raises(ValueError, match="set server.vllm_enforce_eager"):
        PureTextAgentParameters.from_dict({"vllm_enforce_eager": True})


def test_self_hosted_agents_must_name_one_server():
    agents = {
        "prover": {"model_provider": "SelfHosted", "language_model_server_port": 5001},
        "verifier": {"model_provider": "SelfHosted", "language_model_server_port": 5002},
    }
    with pytest.raises(ValueError, match="name different servers"):
        HyperParameters.from_dict(config(**agents))
    agents["prover"]["model_provider"] = "OpenAI"  # an API agent's port is never used
    assert HyperParameters.from_dict(config(**agents)).agents["prover"].model_provider == "OpenAI"


def test_server_counts_are_checked():
    from nip_core.parameters import ServerParameters

    with pytest.raises(ValueError, match="training_num_processes: must be >= 1"):
        ServerParameters(training_num_processes=0)
    with pytest.raises(ValueError, match="vllm_gpu_memory_utilization"):
        ServerParameters(vllm_gpu_memory_utilization=1.5)
