"""`prompt_gradients`: the option that runs a DPO pair's prompt without gradients, from the
agent's parameters to the server's job options, refused where it cannot hold."""

from __future__ import annotations

import pytest

from nip_core.lm_server import training
from nip_core.lm_server.options import OptionsError, TrainingOptions, parse_options
from nip_core.parameters.agents import PureTextAgentParameters
from nip_core.training.fine_tune_jobs import lora_training_options

DPO = {"type": "dpo"}


def test_parsed_for_dpo_and_refused_where_no_prompt_is_shared():
    assert parse_options(DPO, {}).prompt_gradients is True
    assert parse_options(DPO, {"prompt_gradients": False}).prompt_gradients is False
    for method in ({"type": "supervised"}, {"type": "kto"}):
        with pytest.raises(OptionsError, match="needs DPO") as raised:
            parse_options(method, {"prompt_gradients": False})
        assert raised.value.param == "prompt_gradients"
        assert parse_options(method, {"prompt_gradients": True}).prompt_gradients is True
    with pytest.raises(OptionsError, match="activation_checkpointing"):
        parse_options(DPO, {"prompt_gradients": False, "activation_checkpointing": True})
    with pytest.raises(OptionsError, match="true or false"):
        parse_options(DPO, {"prompt_gradients": "no"})


def test_a_frozen_prompt_keeps_activations_even_where_the_trainer_would_checkpoint(monkeypatch):
    monkeypatch.setattr(training, "has_cuda", lambda: True)  # where checkpointing is the default
    assert training.checkpoints_activations(TrainingOptions(method="dpo"), None, [])
    frozen = TrainingOptions(method="dpo", prompt_gradients=False)
    assert not training.checkpoints_activations(frozen, None, [])


def test_the_agent_sends_it_to_dpo_jobs_only_and_only_when_off():
    off = PureTextAgentParameters(training_prompt_gradients=False)
    assert lora_training_options(off, 32.0, 1e-4, "dpo")["prompt_gradients"] is False
    for method in ("supervised", "kto"):
        assert "prompt_gradients" not in lora_training_options(off, 32.0, 1e-4, method)
    on = PureTextAgentParameters()  # the default leaves the request, and its fingerprint, as before
    assert "prompt_gradients" not in lora_training_options(on, 32.0, 1e-4, "dpo")
    with pytest.raises(ValueError, match="training_prompt_gradients"):
        PureTextAgentParameters(
            training_prompt_gradients=False, training_activation_checkpointing=True
        )
