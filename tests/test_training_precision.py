"""Training precision: bf16 frozen weights where the CPU multiplies bf16 natively, fp32 elsewhere,
and LoRA weights with their optimizer state in fp32 either way."""

from __future__ import annotations

import pytest

from nip_core.lm_server import precision, training
from nip_core.lm_server.hardware import cpu_flags
from nip_core.lm_server.options import OptionsError, TrainingOptions, parse_options
from nip_core.parameters.agents import PureTextAgentParameters
from nip_core.training.fine_tune_jobs import lora_training_options
from tests.tiny_model import build_tiny_model

torch = pytest.importorskip("torch")

DPO = {"type": "dpo", "dpo": {"hyperparameters": {"n_epochs": 1, "batch_size": 1}}}
ROWS = [
    {
        "prompt": [{"role": "user", "content": f"Is {n}+{n}={2 * n}?"}],
        "chosen": [{"role": "assistant", "content": "Yes."}],
        "rejected": [{"role": "assistant", "content": "No, it is not."}],
    }
    for n in range(4)
]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(precision, "has_cuda", lambda: False)


def _cpuinfo(tmp_path, flags: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 {flags}\nbogomips\t: 4890\n")
    return str(path)


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    assert cpu_flags(_cpuinfo(tmp_path, "avx2 avx512_bf16")) >= {"avx2", "avx512_bf16"}
    assert cpu_flags(str(tmp_path / "missing")) == set()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [("avx2 fma", "fp32"), ("avx512f avx512_bf16", "bf16"), ("amx_bf16 amx_tile", "bf16")],
)
def test_auto_picks_bf16_only_where_the_cpu_has_it(on_cpu, monkeypatch, tmp_path, flags, expected):
    cpuinfo = _cpuinfo(tmp_path, flags)
    monkeypatch.setattr(precision, "cpu_flags", lambda: cpu_flags(cpuinfo))
    chosen, why = precision.training_precision(TrainingOptions(precision="auto"))
    assert chosen == expected
    assert ("natively" in why) == (expected == "bf16")


def test_an_explicit_precision_wins_over_the_cpu(on_cpu, monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert precision.training_precision(TrainingOptions(precision="fp32"))[0] == "fp32"
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset())
    assert precision.training_precision(TrainingOptions(precision="bf16")) == ("bf16", "asked for")


def test_precision_is_an_option_of_the_request_and_of_the_agent():
    assert parse_options(DPO, {"precision": "bf16"}).precision == "bf16"
    assert parse_options(DPO, None).precision == "auto"
    with pytest.raises(OptionsError, match="precision must be one of"):
        parse_options(DPO, {"precision": "fp8"})
    agent = PureTextAgentParameters(training_precision="bf16")
    assert lora_training_options(agent, 16, 1e-4, "dpo")["precision"] == "bf16"
    # "auto" is not sent: jobs of older configs keep their training fingerprint
    assert "precision" not in lora_training_options(PureTextAgentParameters(), 16, 1e-4, "dpo")


def test_bf16_trains_lora_and_optimizer_state_in_fp32(on_cpu, tiny_model_dir, tmp_path):
    options = TrainingOptions(
        method="dpo", batch_size=1, n_epochs=1, learning_rate=1e-3, lora_rank=4, precision="bf16"
    )
    tokenizer = training.load_tokenizer(str(tiny_model_dir))
    model, peft_config, _ = training.load_for_training(str(tiny_model_dir), None, options)
    trainer = training.build_trainer(options, model, tokenizer, ROWS, str(tmp_path), peft_config)
    trainer.train()
    trained = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    frozen = [p for p in trainer.model.parameters() if not p.requires_grad]
    assert trained and all("lora_" in n and p.dtype == torch.float32 for n, p in trained.items())
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    state = [s for s in trainer.optimizer.state.values() if "exp_avg" in s]
    assert state and all(s["exp_avg"].dtype == torch.float32 for s in state)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert losses and all(loss == loss for loss in losses)  # finite: no NaN
    assert not trainer.args.bf16  # the weights carry the precision on CPU, no autocast
