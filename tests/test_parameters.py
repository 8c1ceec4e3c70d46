"""Construction, defaults, agents, dotted get, validation and registration of parameters."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import re

import pytest

import nip_core
from nip_core.parameters import (
    AgentsParameters,
    BaseParameters,
    CodeValidationParameters,
    CommonProtocolParameters,
    DatasetParameters,
    DebateProtocolParameters,
    HyperParameters,
    MnipProtocolParameters,
    NipProtocolParameters,
    PureTextAgentParameters,
    PureTextEiParameters,
    PureTextMaltParameters,
    RlTrainerParameters,
    TextRlParameters,
    register_parameter_class,
)

SUB_CLASSES = [
    PureTextAgentParameters,
    RlTrainerParameters,
    TextRlParameters,
    PureTextEiParameters,
    PureTextMaltParameters,
    CodeValidationParameters,
    DatasetParameters,
    CommonProtocolParameters,
    NipProtocolParameters,
    DebateProtocolParameters,
    MnipProtocolParameters,
]
COUNT_NAME = re.compile(r"^(num_.*|.*_size|.*_rank|max_.*|per_device_.*)$")


def hyper(**kwargs) -> HyperParameters:
    base = {
        "scenario": "code_validation",
        "trainer": "pure_text_malt",
        "dataset": "humaneval-buggy",
    }
    return HyperParameters(**{**base, **kwargs})


# -- defaults and construction ----------------------------------------------------------------


# nip's tensor-era and checkpoint fields come first on the seed page; they are not ours (the
# version conversion drops them, tests/test_parameters_reference.py)
NIP_ONLY_AGENT_FIELDS = """agent_lr_factor body_lr_factor update_schedule use_manual_architecture
normalize_message_history load_checkpoint_and_parameters checkpoint_entity checkpoint_project
checkpoint_run_id checkpoint_version use_orthogonal_initialisation
orthogonal_initialisation_gain""".split()
SEED_AGENT_FIELDS = """model_provider model_name language_model_server_scheme_host
language_model_server_port
use_dummy_api shared_model_group temperature top_p repetition_penalty
fine_tune_from_scratch freeze_agent quantization num_epochs dpo_beta use_lora lora_rank lora_alpha
lora_alpha_scale lora_dropout stack_lora_adapters per_device_train_batch_size
system_prompt_template_path use_supervisor_message supervisor_name max_response_words
max_tokens_per_message num_invalid_generation_retries request_timeout_seconds model_server_replicas
dpo_loss_type
dpo_rpo_alpha gradient_accumulation_steps shuffle_training_data lora_top_layers
training_activation_checkpointing training_stop_at_pair_accuracy
training_prompt_gradients training_precision""".split()


def test_agent_fields_follow_the_seed_page_order_and_defaults():
    names = [f.name for f in dataclasses.fields(PureTextAgentParameters)]
    assert names == SEED_AGENT_FIELDS and not set(names) & set(NIP_ONLY_AGENT_FIELDS)
    agent = PureTextAgentParameters()
    assert (agent.model_provider, agent.model_name) == ("OpenAI", "gpt-4o-mini-2024-07-18")
    assert (agent.lora_rank, agent.lora_alpha, agent.lora_alpha_scale) == (64, None, 1.0)
    assert agent.is_random is False


def test_hyper_parameters_fill_defaults_and_convert_dicts():
    params = hyper(rl={"num_iterations": 3}, protocol_common={"shared_reward": True})
    assert params.rl == RlTrainerParameters(num_iterations=3)
    assert params.protocol_common.shared_reward is True
    assert params.pure_text_malt == PureTextMaltParameters()
    assert params.rl.num_iterations == 3 and params.rl.rollouts_per_iteration == 20
    assert params.agents["anyone"] == PureTextAgentParameters()
    assert (params.interaction_protocol, params.seed, params.test_size) == ("nip", 6198, 0.2)


def test_ints_given_for_float_fields_become_floats():
    agent = PureTextAgentParameters(temperature=1, lora_alpha_scale=2)
    assert type(agent.temperature) is float and type(agent.lora_alpha_scale) is float


def test_agent_dict_values_are_built_and_default_applies():
    params = hyper(agents={"_default": {"use_dummy_api": True}, "verifier": {"temperature": 0.3}})
    assert isinstance(params.agents, AgentsParameters)
    assert params.agents["verifier"].temperature == 0.3
    assert params.agents["prover"].use_dummy_api is True
    assert "prover" in params.agents and params.agents.get("prover") is params.agents["_default"]
    assert list(params.agents) == ["_default", "verifier"]


def test_agents_without_default_raise_for_unknown_names():
    agents = AgentsParameters(verifier=PureTextAgentParameters())
    assert "prover" not in agents and agents.get("prover") is None
    with pytest.raises(KeyError):
        agents["prover"]


def test_agent_names_must_not_be_substrings_of_each_other():
    with pytest.raises(ValueError, match="substring"):
        AgentsParameters(prover={}, prover0={})


def test_agents_reject_non_agent_values():
    with pytest.raises(ValueError, match="agent 'verifier'"):
        AgentsParameters(verifier=3)


def test_effective_properties():
    assert PureTextAgentParameters(lora_rank=16, lora_alpha_scale=2.0).effective_lora_alpha == 32
    agent = PureTextAgentParameters(lora_alpha=8, lora_alpha_scale=None)
    assert agent.effective_lora_alpha == 8
    assert PureTextAgentParameters(max_response_words=100).effective_max_tokens == 150
    assert PureTextAgentParameters(max_tokens_per_message=77).effective_max_tokens == 77


def test_construct_test_params_on_every_class():
    hp = HyperParameters.construct_test_params()
    assert (hp.scenario, hp.trainer, hp.dataset) == (
        "code_validation",
        "pure_text_malt",
        "humaneval-buggy",
    )
    assert (hp.rl.num_iterations, hp.rl.rollouts_per_iteration) == (2, 4)
    assert hp.agents["verifier"].use_dummy_api is True
    assert PureTextAgentParameters.construct_test_params().use_dummy_api is True
    for cls in SUB_CLASSES:
        assert isinstance(cls.construct_test_params(), cls)


def test_parameters_are_immutable():
    params = hyper()
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.seed = 1  # type: ignore[misc]


# -- to_dict ----------------------------------------------------------------------------------


def test_to_dict_tags_types_and_agents():
    d = hyper().to_dict()
    assert d["_type"] == "HyperParameters" and d["rl"]["_type"] == "RlTrainerParameters"
    agent = d["agents"]["_default"]
    assert agent["_type"] == "PureTextAgentParameters" and agent["is_random"] is False
    assert "update_schedule" not in agent
    assert "_package_version" not in d
    json.dumps(d)


def test_package_meta_is_added_on_request():
    d = hyper().to_dict(include_package_meta=True)
    assert d["_package_name"] == "nip-malt" and d["_package_version"] == nip_core.__version__


def test_config_hash_is_stable_and_sensitive():
    a, b = hyper(), hyper()
    assert a.config_hash() == b.config_hash() and re.fullmatch(r"[0-9a-f]{64}", a.config_hash())
    assert hyper(seed=1).config_hash() != a.config_hash()
    rebuilt = HyperParameters.from_dict(json.loads(json.dumps(a.to_dict())))
    assert rebuilt.config_hash() == a.config_hash()


def test_config_hash_leaves_out_the_iteration_count_so_a_run_can_be_extended():
    two, three = hyper(rl={"num_iterations": 2}), hyper(rl={"num_iterations": 3})
    assert two.config_hash() == three.config_hash() == hyper().config_hash()
    assert hyper(rl={"num_iterations": 2, "rollouts_per_iteration": 5}).config_hash() != (
        two.config_hash()
    )
    # the hash older run folders hold counted the iterations
    assert two.legacy_config_hash() != three.legacy_config_hash()
    assert hyper().legacy_config_hash() == hyper().config_hash()  # the default count: unchanged


def test_to_dict_never_contains_env_api_keys(monkeypatch):
    secret = "sk-test-SECRET-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("OPENROUTER_API_KEY", secret + "x")
    params = hyper(agents={"verifier": {"model_provider": "OpenRouter"}})
    for text in (json.dumps(params.to_dict(include_package_meta=True)), repr(params)):
        assert secret not in text


# -- from_dict --------------------------------------------------------------------------------


def test_from_dict_does_not_mutate_its_input():
    d = hyper(interaction_protocol="debate").to_dict()
    snapshot = json.dumps(d, sort_keys=True)
    HyperParameters.from_dict(d)
    PureTextAgentParameters.from_dict(d["agents"]["_default"])
    assert json.dumps(d, sort_keys=True) == snapshot


def test_from_dict_rejects_unknown_keys_unless_told():
    d = hyper().to_dict()
    d["rl"]["frames_per_batch_typo"] = 5
    with pytest.raises(ValueError, match="frames_per_batch_typo"):
        HyperParameters.from_dict(d)
    assert HyperParameters.from_dict(d, ignore_extra_keys=True).rl == RlTrainerParameters()


def test_from_dict_rejects_unknown_or_incompatible_type():
    d = hyper().to_dict()
    d["rl"]["_type"] = "NoSuchParameters"
    with pytest.raises(ValueError, match="NoSuchParameters"):
        HyperParameters.from_dict(d)
    d["rl"]["_type"] = "TextRlParameters"
    with pytest.raises(ValueError, match="not a kind of RlTrainerParameters"):
        HyperParameters.from_dict(d)


def test_from_dict_checks_is_random_flag():
    d = PureTextAgentParameters().to_dict()
    d["is_random"] = True
    with pytest.raises(ValueError, match="is_random"):
        AgentsParameters.from_dict({"verifier": d})


def test_from_dict_reports_missing_required_fields():
    with pytest.raises(ValueError, match="dataset"):
        HyperParameters.from_dict({"scenario": "code_validation", "trainer": "pure_text_ei"})


def test_agents_from_dict_skips_nip_repr_key():
    agents = AgentsParameters.from_dict({"verifier": {}, "agents_update_repr": "Standard"})
    assert list(agents) == ["verifier"]


# -- dotted get -------------------------------------------------------------------------------


def test_get_walks_dataclasses_and_agents():
    params = hyper(agents={"_default": {"lora_rank": 8}, "verifier": {"lora_rank": 32}})
    assert params.get("agents.verifier.lora_rank") == 32
    assert params.get("agents.prover.lora_rank") == 8
    assert params.get("rl.num_iterations") == 8 and params.get("seed") == 6198
    assert params.rl.get("num_epochs") == 1


@pytest.mark.parametrize(
    ("address", "missing"),
    [
        ("rl.nope", "nope"),
        ("nope", "nope"),
        ("seed.x", "seed"),
        ("agents.verifier.lora_rank.x", "lora_rank"),
    ],
)
def test_get_raises_key_error_naming_the_problem(address, missing):
    with pytest.raises(KeyError, match=missing):
        hyper().get(address)


def test_get_without_default_agent():
    params = hyper(agents={"verifier": {}})
    with pytest.raises(KeyError, match="prover"):
        params.get("agents.prover.lora_rank")


# -- registration -----------------------------------------------------------------------------


@register_parameter_class
@dataclasses.dataclass(frozen=True)
class ExtraAgentParameters(PureTextAgentParameters):
    """A new agent kind registered by a test: it must round-trip through agents dicts."""

    style: str = "terse"


@register_parameter_class
@dataclasses.dataclass(frozen=True)
class GizmoParameters(BaseParameters):
    """A registered value class to nest."""

    actor: float = 1.0


@register_parameter_class
@dataclasses.dataclass(frozen=True)
class GadgetParameters(BaseParameters):
    """A new registered sub-parameter class holding a nested registered class."""

    factors: GizmoParameters | dict | None = None
    batch_size: int = 3


def test_registered_classes_round_trip():
    params = hyper(agents={"verifier": ExtraAgentParameters(style="chatty"), "_default": {}})
    d = json.loads(json.dumps(params.to_dict()))
    assert d["agents"]["verifier"]["_type"] == "ExtraAgentParameters"
    rebuilt = HyperParameters.from_dict(d)
    assert rebuilt == params and isinstance(rebuilt.agents["verifier"], ExtraAgentParameters)
    gadget = GadgetParameters(factors={"actor": 3.0}, batch_size=5)
    assert isinstance(gadget.factors, GizmoParameters)
    assert BaseParameters.from_dict(gadget.to_dict()) == gadget
    meta = params.to_dict(include_package_meta=True)
    assert BaseParameters.from_dict(meta) == params  # dispatched to HyperParameters.from_dict
    with pytest.raises(ValueError, match="batch_size: must be >= 0"):
        GadgetParameters(batch_size=-2)


def test_registration_requires_a_parameter_class_and_unique_name():
    with pytest.raises(TypeError):
        register_parameter_class(int)

    @dataclasses.dataclass(frozen=True)
    class RlTrainerParameters(BaseParameters):  # same name as a registered class
        x: int = 0

    with pytest.raises(ValueError, match="already registered"):
        register_parameter_class(RlTrainerParameters)


def test_agents_are_immutable_but_copy_and_pickle():
    agents = AgentsParameters(verifier={"lora_rank": 8})
    for mutate in (
        lambda: agents.__setitem__("prover", PureTextAgentParameters()),
        lambda: agents.update(prover={}),
        lambda: agents.pop("verifier"),
    ):
        with pytest.raises(TypeError, match="immutable"):
            mutate()
    params = hyper(agents=agents)
    assert pickle.loads(pickle.dumps(params)) == params
    assert copy.deepcopy(params) == params and copy.copy(agents) == agents
    changed = agents.replace_agent("verifier", lora_rank=4)
    assert agents["verifier"].lora_rank == 8 and changed["verifier"].lora_rank == 4
    with_default = agents.with_agent("_default", PureTextAgentParameters(lora_rank=2))
    added = with_default.replace_agent("prover", use_lora=False)
    assert (added["prover"].lora_rank, added["prover"].use_lora) == (2, False)
    assert "prover" not in agents


def test_config_hash_survives_a_new_setting_with_a_default():
    """A package upgrade that adds a setting (here: a field missing from a stored dict, as an
    older version wrote it) keeps the run's hash, so the run still resumes."""
    params = HyperParameters.construct_test_params()
    stored = params.to_dict()
    for agent in stored["agents"].values():
        if isinstance(agent, dict):
            agent.pop("model_server_replicas")
    stored["rl"].pop("num_epochs")
    assert HyperParameters.from_dict(stored).config_hash() == params.config_hash()
    changed = params.to_dict()
    changed["rl"]["num_epochs"] = 3
    assert HyperParameters.from_dict(changed).config_hash() != params.config_hash()
    assert "model_server_replicas" not in str(params.without_defaults())
