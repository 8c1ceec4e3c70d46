"""Validation of parameter objects: types, Literal values, counts and cross-field rules."""

from __future__ import annotations

import dataclasses
import re

import pytest

from nip_core.parameters import (
    DebateProtocolParameters,
    HyperParameters,
    MnipProtocolParameters,
    NipProtocolParameters,
    PureTextAgentParameters,
    PureTextMaltParameters,
)
from nip_core.parameters.typing_utils import field_hints, literal_values
from tests.test_parameters import COUNT_NAME, SUB_CLASSES, hyper


def _literal_fields():
    for cls in [*SUB_CLASSES, HyperParameters]:
        for name, annotation in field_hints(cls).items():
            if literal_values(annotation) is not None:
                yield cls, name


def _count_fields():
    for cls in SUB_CLASSES:
        for name, annotation in field_hints(cls).items():
            if COUNT_NAME.match(name) and int in getattr(annotation, "__args__", (annotation,)):
                yield cls, name


@pytest.mark.parametrize(("cls", "name"), list(_literal_fields()))
def test_every_literal_field_rejects_unknown_values(cls, name):
    kwargs = {"scenario": "code_validation", "trainer": "pure_text_ei", "dataset": "d"}
    kwargs = kwargs if cls is HyperParameters else {}
    with pytest.raises(ValueError, match=f"{cls.__name__}.{name}: 'bogus' is not one of"):
        cls(**{**kwargs, name: "bogus"})


@pytest.mark.parametrize(("cls", "name"), list(_count_fields()))
def test_every_count_field_rejects_negative_values(cls, name):
    with pytest.raises(ValueError, match=f"{name}: must be >="):
        cls(**{name: -1})


def test_count_fields_are_found():
    names = {name for _, name in _count_fields()}
    assert {"lora_rank", "num_iterations", "max_message_rounds", "max_train_size"} <= names
    assert {"per_device_train_batch_size", "rollout_shard_size"} <= names


@pytest.mark.parametrize("scenario", ["graph_isomorphism", "image_classification"])
def test_tensor_scenarios_are_rejected_clearly(scenario):
    with pytest.raises(ValueError, match="not supported"):
        HyperParameters(scenario=scenario, trainer="pure_text_ei", dataset="d")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lora_alpha": 16, "lora_alpha_scale": 1.0}, "exactly one of lora_alpha"),
        ({"lora_alpha": None, "lora_alpha_scale": None}, "exactly one of lora_alpha"),
        ({"temperature": 0.5, "top_p": 0.9}, "at most one of temperature and top_p"),
        ({"lora_rank": "64"}, "lora_rank: expected int"),
        ({"use_lora": 1}, "use_lora: expected bool"),
        ({"max_response_words": True}, "max_response_words: expected int"),
        ({"temperature": float("nan")}, "temperature: must be a finite number"),
        ({"model_name": None}, "model_name: expected str"),
        ({"model_server_replicas": "http://x"}, "model_server_replicas: expected list"),
    ],
)
def test_agent_validation_errors(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        PureTextAgentParameters(**kwargs)


@pytest.mark.parametrize("value", [0.0, -0.1, 1.5])
def test_interval_threshold_proportion_range(value):
    with pytest.raises(ValueError, match="interval_threshold_proportion"):
        PureTextMaltParameters(interval_threshold_proportion=value)
    assert (
        PureTextMaltParameters(interval_threshold_proportion=1.0).interval_threshold_proportion == 1
    )


@pytest.mark.parametrize(
    "cls", [NipProtocolParameters, DebateProtocolParameters, MnipProtocolParameters]
)
def test_min_rounds_cannot_exceed_max_rounds(cls):
    with pytest.raises(ValueError, match="min_message_rounds"):
        cls(max_message_rounds=3, min_message_rounds=4)
    assert cls(max_message_rounds=3, min_message_rounds=3).min_message_rounds == 3


def test_initial_ei_iterations_cannot_exceed_iterations():
    with pytest.raises(ValueError, match="num_initial_ei_iterations"):
        hyper(rl={"num_iterations": 2}, pure_text_malt={"num_initial_ei_iterations": 3})
    assert hyper(rl={"num_iterations": 3}, pure_text_malt={"num_initial_ei_iterations": 3})


def test_nested_validation_errors_surface_through_hyper_parameters():
    with pytest.raises(ValueError, match="TextRlParameters.test_scheme"):
        hyper(text_rl={"test_scheme": "sometimes"})
    with pytest.raises(ValueError, match="seed: expected int"):
        hyper(seed="6198")
    with pytest.raises(ValueError, match="rl: expected"):
        hyper(rl=[1, 2])


def test_replace_revalidates():
    with pytest.raises(ValueError, match="top_p"):
        dataclasses.replace(PureTextAgentParameters(temperature=0.2), top_p=0.5)
