"""Property tests: random valid parameters survive to_dict -> JSON -> from_dict unchanged."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
)
from nip_core.parameters.typing_utils import (
    field_hints,
    is_optional,
    literal_values,
    union_members,
)

# Fewer draws than hypothesis' default: at 40 and 30 this file took 81 s, the suite's third slowest.
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
UNIT = st.floats(min_value=1e-6, max_value=1.0)
ANY_FLOAT = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)
TEXT = st.text(max_size=12)


def _base_strategy(annotation: Any) -> st.SearchStrategy:
    """A strategy for one field, read from its annotation (sub-parameter dicts left out)."""
    values = literal_values(annotation)
    members = union_members(annotation)
    if values is not None:
        inner = st.sampled_from(values)
    elif bool in members:
        inner = st.booleans()
    elif int in members:
        inner = st.integers(min_value=1, max_value=10**6)
    elif float in members:
        inner = UNIT
    elif str in members:
        inner = TEXT
    else:
        return st.nothing()
    return st.none() | inner if is_optional(annotation) else inner


def fields_strategy(cls: type, **overrides: st.SearchStrategy) -> st.SearchStrategy[dict]:
    """A dict of random valid keyword arguments for `cls`."""
    hints = field_hints(cls)
    parts = {}
    for name, annotation in hints.items():
        if name in overrides:
            parts[name] = overrides[name]
            continue
        strategy = _base_strategy(annotation)
        if not strategy.is_empty:
            parts[name] = strategy
    return st.fixed_dictionaries(parts)


@st.composite
def agents(draw) -> PureTextAgentParameters:
    kwargs = draw(fields_strategy(PureTextAgentParameters))
    sampling = draw(st.sampled_from(["temperature", "top_p", "neither"]))
    kwargs["temperature"] = draw(st.floats(0.0, 2.0)) if sampling == "temperature" else None
    kwargs["top_p"] = draw(UNIT) if sampling == "top_p" else None
    if draw(st.booleans()):
        kwargs["lora_alpha"], kwargs["lora_alpha_scale"] = draw(st.integers(1, 512)), None
    else:
        kwargs["lora_alpha"], kwargs["lora_alpha_scale"] = None, draw(UNIT)
    kwargs["lora_dropout"] = draw(st.floats(0.0, 0.99))
    if kwargs["training_activation_checkpointing"]:  # it runs every prompt whole
        kwargs["training_prompt_gradients"] = True
    return PureTextAgentParameters(**kwargs)


@st.composite
def rounds(draw, cls: type) -> BaseParameters:
    kwargs = draw(fields_strategy(cls))
    kwargs["max_message_rounds"] = draw(st.integers(1, 20))
    kwargs["min_message_rounds"] = draw(st.integers(0, kwargs["max_message_rounds"]))
    return cls(**kwargs)


def simple(cls: type, **overrides: st.SearchStrategy) -> st.SearchStrategy:
    return fields_strategy(cls, **overrides).map(lambda kw: cls(**kw))


MALT = simple(
    PureTextMaltParameters,
    num_initial_ei_iterations=st.integers(0, 5),
    rollout_early_verdict_retries=st.integers(0, 5),
)
EI = simple(
    PureTextEiParameters, reward_threshold=ANY_FLOAT, weighting_minimum=st.none() | ANY_FLOAT
)
COMMON = simple(
    CommonProtocolParameters,
    **{
        name: ANY_FLOAT
        for name in ("prover_reward", "verifier_reward", "verifier_incorrect_penalty")
    },
)
NAMES = st.sampled_from(["verifier", "prover", "prover0", "prover1", "_default"])


@st.composite
def hyper_params(draw) -> HyperParameters:
    names = draw(st.lists(NAMES, unique=True, max_size=3))
    if "prover" in names and ("prover0" in names or "prover1" in names):
        names.remove("prover")
    rl = draw(simple(RlTrainerParameters, num_iterations=st.integers(5, 50)))
    text_rl = draw(
        simple(
            TextRlParameters,
            validation_fraction=st.floats(1e-6, 1, exclude_max=True),
            switch_guard_max_verdict_share=st.none() | st.floats(0.5, 1, exclude_min=True),
        )
    )
    malt = draw(MALT)
    # The signal names what the label share writes (`validation.check_training_signal`).
    labels = text_rl.verifier_guess_replacement_proportion > 0
    if labels != malt.trains_on_label_pairs:
        signal = "sampled_and_label_pairs" if labels else "sampled_pairs"
        malt = dataclasses.replace(malt, verifier_training_signal=signal)
    # Sparing a settled label changes a balance that must be on (`check_training_signal`).
    if malt.balance_spares_settled_labels and not malt.balance_verifier_by_label:
        malt = dataclasses.replace(malt, balance_verifier_by_label=True)
    common = draw(COMMON)
    # Early verdicts can be re-sampled only where a verifier may give one (`check_across_sections`).
    if malt.rollout_early_verdict_retries and not common.early_decision_ends_episode:
        malt = dataclasses.replace(malt, rollout_early_verdict_retries=0)
    drawn = {name: draw(agents()) for name in names}
    served = [a for a in drawn.values() if a.model_provider == "SelfHosted" and not a.use_dummy_api]
    if served:  # one server serves the run: its self-hosted agents name the same one
        address = {
            "language_model_server_scheme_host": served[0].language_model_server_scheme_host,
            "language_model_server_port": served[0].language_model_server_port,
        }
        drawn = {
            name: dataclasses.replace(a, **address) if a.model_provider == "SelfHosted" else a
            for name, a in drawn.items()
        }
    kwargs = dict(
        scenario="code_validation",
        trainer=draw(st.sampled_from(["pure_text_ei", "pure_text_malt"])),
        dataset=draw(TEXT),
        interaction_protocol=draw(
            st.sampled_from(["nip", "adp", "debate", "merlin_arthur", "mnip", "solo_verifier"])
        ),
        seed=draw(st.integers(0, 2**32)),
        test_size=draw(st.floats(0.0, 1.0)),
        agents=AgentsParameters(drawn),
        rl=rl,
        text_rl=text_rl,
        pure_text_ei=draw(EI),
        pure_text_malt=malt,
        code_validation=draw(simple(CodeValidationParameters)),
        # A second train grade pools only as pairs (`check_train_extra_difficulty`); none of the
        # drawn protocols shows pairs.
        dataset_options=dataclasses.replace(
            draw(simple(DatasetParameters)), train_extra_difficulty=None
        ),
        protocol_common=common,
        nip_protocol=draw(rounds(NipProtocolParameters)),
        debate_protocol=draw(rounds(DebateProtocolParameters)),
        mnip_protocol=draw(rounds(MnipProtocolParameters)),
    )
    try:
        return HyperParameters(**kwargs)
    except ValueError as error:  # KTO where it cannot train (`check_training_objective`)
        if "training_objective=kto" not in str(error):
            raise
        kwargs["pure_text_malt"] = dataclasses.replace(malt, training_objective="dpo")
        return HyperParameters(**kwargs)


def assert_round_trips(params: BaseParameters, **to_dict_kwargs: Any) -> None:
    d = params.to_dict(**to_dict_kwargs)
    snapshot = copy.deepcopy(d)
    via_json = json.loads(json.dumps(d, allow_nan=False))
    assert via_json == d  # JSON-serialisable without loss
    rebuilt = type(params).from_dict(via_json)
    assert rebuilt == params
    assert rebuilt.to_dict(**to_dict_kwargs) == d
    type(params).from_dict(d)
    assert d == snapshot  # from_dict left its input alone


@SETTINGS
@given(agents())
def test_agent_round_trip(agent):
    assert_round_trips(agent)
    assert BaseParameters.from_dict(agent.to_dict()) == agent  # dispatch by `_type` alone


@SETTINGS
@given(MALT, EI)
def test_trainer_round_trip(malt, ei):
    assert_round_trips(malt)
    assert_round_trips(ei)


@SETTINGS
@given(
    COMMON,
    rounds(NipProtocolParameters),
    rounds(DebateProtocolParameters),
    rounds(MnipProtocolParameters),
)
def test_protocol_round_trip(common, nip, debate, mnip):
    for params in (common, nip, debate, mnip):
        assert_round_trips(params)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hyper_params())
def test_hyper_parameters_round_trip(params):
    assert_round_trips(params)
    assert_round_trips(params, include_package_meta=True)
    rebuilt = HyperParameters.from_dict(json.loads(json.dumps(params.to_dict())))
    assert rebuilt.config_hash() == params.config_hash()
    for name in params.agents:
        address = f"agents.{name}.lora_rank"
        assert rebuilt.get(address) == params.agents[name].lora_rank
