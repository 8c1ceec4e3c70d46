"""Files, dotted overrides and upgrading old parameter dicts."""

from __future__ import annotations

import json
import warnings

import pytest
import yaml

import nip_core
from nip_core.parameters import (
    HyperParameters,
    NipProtocolParameters,
    PureTextAgentParameters,
    apply_overrides,
    convert_hyper_param_dict,
    load_hyper_params,
    save_hyper_params,
    versions,
)

CONFIG = {
    "scenario": "code_validation",
    "trainer": "pure_text_malt",
    "dataset": "humaneval-buggy",
    "interaction_protocol": "debate",
    "agents": {"_default": {"use_dummy_api": True}, "verifier": {"temperature": 0.2}},
    "rl": {"num_iterations": 3},
    "pure_text_malt": {"pair_selection_method": "interval"},
}


# -- files ------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_load_hand_written_file(tmp_path, suffix):
    path = tmp_path / f"config{suffix}"
    path.write_text(json.dumps(CONFIG) if suffix == ".json" else yaml.safe_dump(CONFIG))
    params = load_hyper_params(path, ["rl.num_iterations=5"])
    assert params.interaction_protocol == "debate" and params.rl.num_iterations == 5
    assert params.agents["verifier"].temperature == 0.2
    assert params.agents["prover0"].use_dummy_api is True
    assert params.pure_text_malt.pair_selection_method == "interval"


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_save_then_load_round_trips(tmp_path, suffix):
    params = HyperParameters.from_dict(CONFIG)
    path = save_hyper_params(params, tmp_path / f"saved{suffix}")
    assert load_hyper_params(str(path)) == params
    text = path.read_text()
    assert "_package_version" in text and nip_core.__version__ in text


def test_load_rejects_bad_files(tmp_path):
    (tmp_path / "c.toml").write_text("x = 1")
    with pytest.raises(ValueError, match="yaml"):
        load_hyper_params(tmp_path / "c.toml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="mapping"):
        load_hyper_params(tmp_path / "list.yaml")
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({**CONFIG, "rl": {"num_iteratons": 2}}))
    with pytest.raises(ValueError, match="num_iteratons"):
        load_hyper_params(tmp_path / "typo.yaml")
    with pytest.raises(FileNotFoundError):
        load_hyper_params(tmp_path / "missing.yaml")


# -- overrides --------------------------------------------------------------------------------


def test_overrides_parse_yaml_scalars_and_return_a_new_object():
    params = HyperParameters.from_dict(CONFIG)
    new = apply_overrides(
        params,
        [
            "agents.verifier.temperature=0.7",
            "agents.verifier.max_tokens_per_message=300",
            "text_rl.fine_tune_on_all_previous_rollouts=true",
            "protocol_common.force_guess=y",
            "agents.verifier.model_name=1234",
            "dataset_options.max_train_size=null",
            "protocol_common.prover_reward=2",
        ],
    )
    assert params.agents["verifier"].temperature == 0.2  # the original is untouched
    verifier = new.agents["verifier"]
    assert (verifier.temperature, verifier.max_tokens_per_message) == (0.7, 300)
    assert verifier.model_name == "1234"
    assert new.text_rl.fine_tune_on_all_previous_rollouts is True
    assert new.protocol_common.force_guess == "y"
    assert new.protocol_common.prover_reward == 2.0
    assert type(new.protocol_common.prover_reward) is float


def test_override_of_unlisted_agent_starts_from_default():
    params = HyperParameters.from_dict(CONFIG)
    new = apply_overrides(params, ["agents.prover0.lora_rank=8"])
    assert list(new.agents) == ["_default", "verifier", "prover0"]
    assert new.agents["prover0"] == PureTextAgentParameters(use_dummy_api=True, lora_rank=8)
    assert new.agents["prover1"].lora_rank == 64


@pytest.mark.parametrize(
    ("override", "error", "message"),
    [
        ("rl.num_iterations=abc", ValueError, "'rl.num_iterations': expected int"),
        ("rl.num_iterations=1.5", ValueError, "'rl.num_iterations': expected int"),
        ("rl.num_iterations=null", ValueError, "None is not allowed"),
        ("agents.verifier.use_lora=maybe", ValueError, "expected bool"),
        ("pure_text_malt.pair_selection_method=best", ValueError, "one of 'positive_negative'"),
        ("agents.verifier.top_p=0.5", ValueError, "at most one of temperature and top_p"),
        ("rl.num_iterations=-1", ValueError, "must be >= 0"),
        ("rl=3", ValueError, "whole sub-parameter"),
        ("agents.verifier=3", ValueError, "not the whole agent"),
        ("no_such=1", KeyError, "no_such"),
        ("rl.no_such=1", KeyError, "no_such"),
        ("seed.x=1", KeyError, "continues past"),
        ("rl.num_iterations", ValueError, "dotted.key=value"),
        ("rl.learning_rate=1e-2x", ValueError, "^override 'rl.learning_rate': expected float, got"),
        ("rl.learning_rate=1,5", ValueError, "'rl.learning_rate': expected float, got '1,5'"),
        ("rl.learning_rate=0.0.1", ValueError, "'rl.learning_rate': expected float"),
        ("rl.learning_rate=-1e-2", ValueError, "learning_rate: must be > 0"),
        ("agents.verifier.request_timeout_seconds=0", ValueError, "must be > 0"),
        ("agents.verifier.request_timeout_seconds=soon", ValueError, "expected float | None"),
    ],
)
def test_bad_overrides(override, error, message):
    with pytest.raises(error, match=message):
        apply_overrides(HyperParameters.from_dict(CONFIG), [override])


def test_override_needs_default_for_unlisted_agent():
    params = HyperParameters.from_dict({**CONFIG, "agents": {"verifier": {}}})
    with pytest.raises(KeyError, match="prover"):
        apply_overrides(params, ["agents.prover.lora_rank=8"])


def test_overrides_must_be_a_sequence_of_strings():
    with pytest.raises(ValueError, match="sequence"):
        apply_overrides(HyperParameters.from_dict(CONFIG), "rl.num_iterations=2")


# -- versions ---------------------------------------------------------------------------------

OLD_NIP_DICT = {
    "scenario": "code_validation",
    "trainer": "pure_text_ei",
    "dataset": "buggy_apps",
    "interaction_protocol": "pvg",
    "seed": 42,
    "functionalize_modules": False,
    "d_representation": 16,
    "ppo": {"_type": "CommonPpoParameters", "clip_epsilon": 0.2},
    "agents": {
        "verifier": {"_type": "PureTextAgentParameters", "is_random": False, "temperature": 0.5},
        "prover": {"_type": "PureTextAgentParameters", "is_random": False},
        "agents_update_repr": "Standard",
    },
    "rl": {"frames_per_batch": 1000, "rollouts_per_iteration": None, "num_iterations": 8},
    "text_rl": {"save_transcripts": True, "fine_tune_on_all_previous_rollouts": True},
    "pvg_protocol": {"_type": "PvgProtocolParameters", "max_message_rounds": 9},
}


def test_old_nip_dict_is_upgraded():
    snapshot = json.dumps(OLD_NIP_DICT, sort_keys=True)
    with pytest.warns(UserWarning, match="ppo"):
        params = HyperParameters.from_dict(OLD_NIP_DICT)
    assert json.dumps(OLD_NIP_DICT, sort_keys=True) == snapshot
    assert params.interaction_protocol == "nip" and params.seed == 42
    assert params.nip_protocol == NipProtocolParameters(max_message_rounds=9)
    assert params.rl.num_iterations == 8 and params.rl.rollouts_per_iteration == 20
    assert params.text_rl.fine_tune_on_all_previous_rollouts is True
    assert params.agents["verifier"].temperature == 0.5


def test_adp_rename_and_converter_output():
    old = {**CONFIG, "interaction_protocol": "abstract_decision_problem"}
    new = convert_hyper_param_dict(old)
    assert new["interaction_protocol"] == "adp" and old["interaction_protocol"] != "adp"
    assert new["_package_version"] == nip_core.__version__
    assert new["_package_name"] == "nip-malt"


def test_current_dicts_are_not_converted():
    d = {**CONFIG, "_package_version": nip_core.__version__, "interaction_protocol": "pvg"}
    with pytest.raises(ValueError, match="'pvg' is not one of"):
        HyperParameters.from_dict(d)


def test_conflicting_protocol_sections_are_an_error():
    with pytest.raises(ValueError, match="pvg_protocol"):
        convert_hyper_param_dict({**CONFIG, "pvg_protocol": {}, "nip_protocol": {}})


def test_hand_written_config_survives_conversion_unchanged():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        converted = convert_hyper_param_dict(CONFIG)
    assert {k: v for k, v in converted.items() if not k.startswith("_package")} == CONFIG


def test_newer_or_invalid_versions_are_rejected():
    with pytest.raises(ValueError, match="newer"):
        HyperParameters.from_dict({**CONFIG, "_package_version": "99.0.0"})
    with pytest.raises(ValueError, match="invalid version"):
        HyperParameters.from_dict({**CONFIG, "_package_version": "one"})


def test_conversions_chain_in_order(monkeypatch):
    """None -> 0.1.0 (real) -> 0.3.0 (test step, registered from 0.2.0); 0.1.5 jumps to 0.2.0."""
    monkeypatch.setattr(versions, "_CONVERSIONS", dict(versions._CONVERSIONS))

    @versions.register_conversion("0.2.0", "0.3.0")
    def _double_seed(d: dict) -> dict:
        return {**d, "seed": d.get("seed", 0) * 2}

    old = {**CONFIG, "interaction_protocol": "pvg", "seed": 5}
    out = convert_hyper_param_dict(old, target="0.3.0")
    assert (out["interaction_protocol"], out["seed"]) == ("nip", 10)
    assert out["_package_version"] == "0.3.0"
    mid = convert_hyper_param_dict({**CONFIG, "seed": 5, "_package_version": "0.1.5"}, "0.3.0")
    assert mid["seed"] == 10
    done = convert_hyper_param_dict({**CONFIG, "seed": 5, "_package_version": "0.3.0"}, "0.3.0")
    assert done["seed"] == 5
    with pytest.raises(ValueError, match="already registered"):
        versions.register_conversion("0.2.0", "0.4.0")(_double_seed)
    with pytest.raises(ValueError, match="forwards"):
        versions.register_conversion("0.5.0", "0.4.0")


def test_foreign_package_dicts_count_as_unversioned():
    d = {**CONFIG, "interaction_protocol": "pvg", "_package_name": "nip", "_package_version": "1.0"}
    assert HyperParameters.from_dict(d).interaction_protocol == "nip"


# -- numbers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1e-2", 0.01),
        ("1E-2", 0.01),
        ("5e-5", 5e-5),
        ("1.0e-5", 1e-5),
        ("1.0E+5", 1e5),
        ("+1e3", 1000.0),
        ("2e0", 2.0),
        (".5", 0.5),
        ("5.", 5.0),
        ("0.25", 0.25),
        ("1_000", 1000.0),
        ("1_000.5", 1000.5),
        ("3", 3.0),
        ("010", 10.0),
    ],
)
def test_float_fields_take_every_usual_spelling(raw, expected):
    params = apply_overrides(HyperParameters.from_dict(CONFIG), [f"rl.learning_rate={raw}"])
    assert params.rl.learning_rate == expected and type(params.rl.learning_rate) is float


def test_negative_and_leading_dot_floats():
    new = apply_overrides(
        HyperParameters.from_dict(CONFIG),
        ["protocol_common.verifier_incorrect_penalty=-.5", "protocol_common.prover_reward=-3"],
    )
    assert new.protocol_common.verifier_incorrect_penalty == -0.5
    assert new.protocol_common.prover_reward == -3.0
    assert type(new.protocol_common.prover_reward) is float


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("12", 12), ("1e1", 10), ("1.5e1", 15), ("2E+1", 20), ("10.0", 10), ("1_0", 10), ("010", 10)],
)
def test_int_fields_take_whole_numbers_in_any_spelling(raw, expected):
    params = apply_overrides(HyperParameters.from_dict(CONFIG), [f"rl.num_iterations={raw}"])
    assert params.rl.num_iterations == expected and type(params.rl.num_iterations) is int


def test_int_spelled_with_an_exponent_is_exact():
    base = HyperParameters.from_dict(CONFIG)
    new = apply_overrides(base, ["seed=123456789012345678901e1"])  # beyond float precision
    assert new.seed == 1234567890123456789010


@pytest.mark.parametrize("raw", ["1.5", "1e-1", "1.05e1", "2.5E0"])
def test_int_fields_reject_fractions(raw):
    with pytest.raises(
        ValueError, match=f"^override 'rl.num_iterations': expected int, got '{raw}'$"
    ):
        apply_overrides(HyperParameters.from_dict(CONFIG), [f"rl.num_iterations={raw}"])


@pytest.mark.parametrize(
    ("override", "expects"),
    [
        ("rl.learning_rate=inf", "float"),
        ("rl.learning_rate=-inf", "float"),
        ("rl.learning_rate=.inf", "float"),
        ("rl.learning_rate=-.Inf", "float"),
        ("rl.learning_rate=nan", "float"),
        ("rl.learning_rate=.NaN", "float"),
        ("rl.learning_rate=1e999", "float"),
        ("rl.num_iterations=.inf", "int"),
        ("agents.verifier.temperature=inf", "float | None"),
    ],
)
def test_infinity_and_nan_are_rejected(override, expects):
    key, _, raw = override.partition("=")
    message = rf"^override '{key}': expected a finite number \({expects}\), got '{raw}'$"
    with pytest.raises(ValueError, match=message):
        apply_overrides(HyperParameters.from_dict(CONFIG), [override])


def test_numeric_looking_strings_stay_strings_through_save_and_load(tmp_path):
    overrides = ["agents.verifier.model_name=1e3", "agents.prover0.model_name=010"]
    overrides.append("agents.prover1.model_name=inf")
    params = apply_overrides(HyperParameters.from_dict(CONFIG), overrides)
    names = [params.agents[a].model_name for a in ("verifier", "prover0", "prover1")]
    assert names == ["1e3", "010", "inf"]
    for suffix in (".yaml", ".json"):
        path = save_hyper_params(params, tmp_path / f"saved{suffix}")
        assert load_hyper_params(path) == params


CONFIG_WITH_EXPONENTS = """
scenario: code_validation
trainer: pure_text_malt
dataset: humaneval-buggy
agents:
  _default: {use_dummy_api: true, lora_dropout: 5e-2, request_timeout_seconds: 3e2}
  verifier: {temperature: .7, dpo_beta: 1E-1}
rl:
  learning_rate: 1e-2
  num_iterations: 04
protocol_common:
  verifier_incorrect_penalty: -.5
"""


def test_yaml_files_read_exponents_as_floats(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG_WITH_EXPONENTS)
    params = load_hyper_params(path, ["rl.learning_rate=5e-5"])
    assert load_hyper_params(path).rl.learning_rate == 0.01
    assert params.rl.learning_rate == 5e-5 and params.rl.num_iterations == 4
    verifier, prover = params.agents["verifier"], params.agents["prover0"]
    assert (verifier.temperature, verifier.dpo_beta, prover.lora_dropout) == (0.7, 0.1, 0.05)
    assert prover.request_timeout_seconds == 300.0
    assert params.protocol_common.verifier_incorrect_penalty == -0.5
    saved = save_hyper_params(params, tmp_path / "saved.yaml")
    assert load_hyper_params(saved) == params


def test_yaml_file_with_fractional_int_names_the_field(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG_WITH_EXPONENTS.replace("num_iterations: 04", "num_iterations: 1e1"))
    with pytest.raises(ValueError, match=r"num_iterations: expected int, got float 10\.0"):
        load_hyper_params(path)


def test_request_timeout_is_an_agent_parameter_that_round_trips(tmp_path):
    params = HyperParameters.from_dict(CONFIG)
    assert params.agents["verifier"].request_timeout_seconds is None
    new = apply_overrides(
        params,
        [
            "agents.verifier.request_timeout_seconds=1.5e2",
            "agents.prover0.request_timeout_seconds=30",
        ],
    )
    assert new.agents["verifier"].request_timeout_seconds == 150.0
    assert new.agents["prover0"].request_timeout_seconds == 30.0
    assert new.agents["prover1"].request_timeout_seconds is None
    assert HyperParameters.from_dict(new.to_dict()) == new
    for suffix in (".yaml", ".json"):
        assert load_hyper_params(save_hyper_params(new, tmp_path / f"s{suffix}")) == new
    back = apply_overrides(new, ["agents.verifier.request_timeout_seconds=null"])
    assert back.agents["verifier"].request_timeout_seconds is None
