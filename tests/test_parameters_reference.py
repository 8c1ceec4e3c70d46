"""Loading configs written by nip (the reference library): its class names and package keys."""

from __future__ import annotations

import copy
import json

import pytest

from nip_core.parameters import (
    REFERENCE_CLASSES,
    UNSUPPORTED_REFERENCE_CLASSES,
    AgentsParameters,
    HyperParameters,
    PureTextAgentParameters,
    load_hyper_params,
    parameter_class,
)


def _nip_agent(**changes) -> dict:
    """An agent dict as nip 1.0's `CodeValidationAgentParameters.to_dict()` writes it."""
    agent = {
        "agent_lr_factor": None,
        "body_lr_factor": None,
        "update_schedule": {"_type": "ConstantUpdateSchedule"},
        "use_manual_architecture": False,
        "normalize_message_history": False,
        "load_checkpoint_and_parameters": False,
        "checkpoint_entity": "",
        "checkpoint_project": "",
        "checkpoint_run_id": None,
        "checkpoint_version": "latest",
        "use_orthogonal_initialisation": True,
        "orthogonal_initialisation_gain": 1.0,
        "model_provider": "OpenAI",
        "model_name": "gpt-4o-mini-2024-07-18",
        "use_dummy_api": True,
        "shared_model_group": None,
        "temperature": None,
        "top_p": None,
        "fine_tune_from_scratch": True,
        "freeze_agent": False,
        "max_response_words": 150,
        "max_tokens_per_message": None,
        "num_invalid_generation_retries": 20,
        "_type": "CodeValidationAgentParameters",
        "is_random": False,
    }
    agent.update(changes)
    return agent


def nip_config() -> dict:
    """`HyperParameters.to_dict(include_package_meta=True)` of a nip solo-verifier run."""
    return {
        "scenario": "code_validation",
        "trainer": "pure_text_malt",
        "dataset": "lrhammond/buggy-apps",
        "interaction_protocol": "solo_verifier",
        "seed": 42,
        "functionalize_modules": False,
        "pretrain_agents": False,
        "test_size": 0.2,
        "d_representation": 16,
        "message_size": 1,
        "include_linear_message_space": False,
        "d_linear_message_space": 2,
        "agents": {
            "verifier": _nip_agent(temperature=0.7, max_response_words=120),
            "agents_update_repr": "Standard",
        },
        "rl": {
            "frames_per_batch": None,
            "rollouts_per_iteration": 16,
            "steps_per_env_per_iteration": None,
            "num_iterations": 5,
            "num_epochs": 4,
            "minibatch_size": 64,
            "lr": 0.003,
            "anneal_lr": False,
            "max_grad_norm": 1.0,
            "loss_critic_type": "smooth_l1",
            "clip_value": False,
            "normalize_observations": True,
            "num_normalization_steps": 1000,
            "gamma": 0.9,
            "lmbda": 0.95,
            "body_lr_factor": None,
            "use_shared_body": True,
            "num_test_iterations": 10,
            "_type": "RlTrainerParameters",
        },
        "ppo": {"_type": "CommonPpoParameters", "clip_epsilon": 0.2},
        "vanilla_ppo": {"_type": "VanillaPpoParameters"},
        "spg": {"_type": "SpgParameters", "variant": "psos"},
        "reinforce": {"_type": "ReinforceParameters", "use_advantage_and_critic": False},
        "solo_agent": {"_type": "SoloAgentParameters", "num_epochs": 100},
        "text_rl": {
            "fine_tune_on_all_previous_rollouts": False,
            "verifier_guess_replacement_proportion": 0.0,
            "verifier_guess_replacement_annealing": "none",
            "verifier_guess_replacement_annealing_rate": 0.1,
            "save_transcripts": True,
            "transcript_format": "yaml",
            "test_scheme": "last",
            "test_on_whole_dataset": True,
            "_type": "TextRlParameters",
        },
        "pure_text_ei": {
            "rollout_selection_method": "threshold",
            "reward_threshold": 0.9,
            "weighting_sample_size_factor": 0.5,
            "weighting_minimum": None,
            "weighting_use_replacement": True,
            "weighting_epsilon": 0.01,
            "_type": "PureTextEiParameters",
        },
        "pure_text_malt": {
            "num_responses_per_timestep": 3,
            "frozen_agents_generate_one_response": True,
            "pair_selection_method": "interval",
            "interval_threshold_proportion": 0.2,
            "_type": "PureTextMaltParameters",
        },
        "image_classification": {
            "num_block_groups": 1,
            "initial_num_channels": 16,
            "_type": "ImageClassificationParameters",
        },
        "code_validation": {
            "apps_difficulty": "introductory",
            "apps_solution_number": 0,
            "apps_exclude_flagged": True,
            "_type": "CodeValidationParameters",
        },
        "dataset_options": {
            "binarification_method": "merge",
            "selected_classes": None,
            "binarification_seed": None,
            "make_balanced": True,
            "max_train_size": 100,
            "_type": "DatasetParameters",
        },
        "protocol_common": {
            "verifier_first": True,
            "randomize_prover_stance": False,
            "prover_reward": 1.0,
            "verifier_reward": 1.0,
            "verifier_incorrect_penalty": -1.0,
            "verifier_terminated_penalty": -1.0,
            "verifier_no_guess_reward": 0.0,
            "shared_reward": False,
            "force_guess": None,
            "zero_knowledge": False,
            "_type": "CommonProtocolParameters",
        },
        "nip_protocol": {
            "max_message_rounds": 4,
            "min_message_rounds": 1,
            "_type": "NipProtocolParameters",
        },
        "debate_protocol": {
            "max_message_rounds": 8,
            "min_message_rounds": 1,
            "sequential": False,
            "prover0_first": True,
            "randomize_channel_order": True,
            "_type": "DebateProtocolParameters",
        },
        "mnip_protocol": {
            "max_message_rounds": 8,
            "min_message_rounds": 1,
            "sequential": False,
            "prover0_first": True,
            "randomize_channel_order": True,
            "_type": "MnipProtocolParameters",
        },
        "zk_protocol": {
            "simulator_reward_coefficient": 1.0,
            "aux_prover_reward_coefficient": 1.0,
            "_type": "ZkProtocolParameters",
        },
        "message_regression": {"enabled": False, "_type": "MessageRegressionParameters"},
        "base_run": {"base_run_type": "none", "_type": "BaseRunParameters"},
        "_type": "HyperParameters",
        "_package_version": "1.0.0",
        "_package_name": "nip",
    }


def _check_loaded(params: HyperParameters) -> None:
    assert params.scenario == "code_validation" and params.trainer == "pure_text_malt"
    assert params.interaction_protocol == "solo_verifier"
    assert params.dataset == "lrhammond/buggy-apps" and params.seed == 42
    verifier = params.agents["verifier"]
    assert type(verifier) is PureTextAgentParameters
    assert verifier.temperature == 0.7 and verifier.max_response_words == 120
    assert verifier.use_dummy_api is True
    assert not hasattr(verifier, "update_schedule")  # nip's tensor-era settings are dropped
    assert isinstance(params.agents, AgentsParameters) and list(params.agents) == ["verifier"]
    assert params.rl.num_iterations == 5 and params.rl.rollouts_per_iteration == 16
    assert params.rl.num_epochs == 4 and params.rl.num_test_iterations == 10
    assert params.text_rl.test_scheme == "last"
    assert params.pure_text_malt.num_responses_per_timestep == 3
    assert params.pure_text_malt.pair_selection_method == "interval"
    assert params.pure_text_malt.interval_threshold_proportion == 0.2
    assert params.code_validation.apps_difficulty == "introductory"
    assert params.dataset_options.max_train_size == 100
    assert params.nip_protocol.max_message_rounds == 4
    assert params.protocol_common.verifier_first is True


def test_from_dict_loads_a_nip_written_code_validation_config():
    data = nip_config()
    original = copy.deepcopy(data)
    with pytest.warns(UserWarning, match="nip-only"):
        params = HyperParameters.from_dict(data)
    assert data == original  # the input is left alone
    _check_loaded(params)
    # what we write back uses our names and our package meta, and loads again unchanged
    ours = params.to_dict(include_package_meta=True)
    assert ours["agents"]["verifier"]["_type"] == "PureTextAgentParameters"
    assert ours["_package_name"] == "nip-malt"
    assert HyperParameters.from_dict(ours) == params


def test_load_hyper_params_accepts_a_nip_written_json_file(tmp_path):
    path = tmp_path / "nip_config.json"
    path.write_text(json.dumps(nip_config(), indent=2))
    with pytest.warns(UserWarning, match="nip-only"):
        params = load_hyper_params(path, ["agents.verifier.temperature=0.3"])
    assert params.agents["verifier"].temperature == 0.3
    assert type(params.agents["verifier"]) is PureTextAgentParameters


def test_code_validation_agent_name_loads_in_sub_parameter_from_dict():
    agents = AgentsParameters.from_dict(
        {"_default": _nip_agent(), "prover": _nip_agent(model_name="gpt-4o")}
    )
    assert type(agents["prover"]) is PureTextAgentParameters
    assert agents["prover"].model_name == "gpt-4o"
    assert agents["verifier"] == PureTextAgentParameters(use_dummy_api=True)
    assert PureTextAgentParameters.from_dict(_nip_agent()).use_dummy_api is True


def test_every_reference_name_resolves_to_its_class():
    assert REFERENCE_CLASSES["CodeValidationAgentParameters"] is PureTextAgentParameters
    for name, cls in REFERENCE_CLASSES.items():
        assert parameter_class(name) is cls


def test_unknown_and_unsupported_names_fail_clearly():
    data = nip_config()
    data["agents"]["verifier"]["_type"] = "CodeValidationAgentParametrs"
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="unknown parameter class"):
        HyperParameters.from_dict(data)
    for name in UNSUPPORTED_REFERENCE_CLASSES:
        with pytest.raises(ValueError, match=f"{name}.*not supported"):
            parameter_class(name)
    data = nip_config()
    data["agents"]["verifier"]["update_schedule"] = {
        "_type": "AlternatingPeriodicUpdateSchedule",
        "AlternatingPeriodicUpdateSchedule": {"period": 2, "first_agent_num_rounds": 1},
    }
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="not supported"):
        HyperParameters.from_dict(data)
    # a name nip writes for a different kind of value is still rejected for this field
    data = nip_config()
    data["nip_protocol"]["_type"] = "CodeValidationAgentParameters"
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="not a kind of"):
        HyperParameters.from_dict(data)


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("load_checkpoint_and_parameters", True, "nip checkpoints are not loaded"),
        ("agent_lr_factor", {"_type": "LrFactors", "actor": 0.5, "critic": 1.0}, "one rate"),
        ("use_orthogonal_initialisation", False, "tensor agents"),
        ("update_schedule", {"_type": "ContiguousPeriodicUpdateSchedule"}, "every iteration"),
    ],
)
def test_nip_agent_settings_other_than_nips_values_are_refused_by_name(key, value, reason):
    data = nip_config()
    data["agents"]["verifier"][key] = value
    with pytest.warns(UserWarning), pytest.raises(ValueError, match=f"{key}=.*{reason}"):
        HyperParameters.from_dict(data)


def test_nip_agent_settings_at_nips_values_load_without_them():
    agent = _nip_agent(agent_lr_factor={"_type": "LrFactors", "actor": 1.0, "critic": 1.0})
    agent["checkpoint_run_id"] = "abc"  # where to load from: unread unless loading is asked for
    loaded = PureTextAgentParameters.from_dict(agent)
    assert loaded == PureTextAgentParameters(use_dummy_api=True)
    assert "checkpoint_run_id" not in loaded.to_dict()
