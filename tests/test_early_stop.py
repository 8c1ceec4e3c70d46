"""`stop_at_pair_accuracy`: a DPO job ends after the first epoch that ranks its pairs right at
the asked rate, instead of always running `n_epochs`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nip_core.lm_server import train_job
from nip_core.lm_server.early_stop import epoch_fitted
from nip_core.lm_server.options import OptionsError, TrainingOptions, parse_options
from nip_core.lm_server.store import read_events
from nip_core.parameters.agents import PureTextAgentParameters
from nip_core.training.fine_tune_jobs import lora_training_options
from tests.conftest_lm import dpo_lines
from tests.tiny_model import build_tiny_model


def test_the_option_is_parsed_and_checked():
    dpo = {"type": "dpo"}
    assert parse_options(dpo, {}).stop_at_pair_accuracy is None
    assert parse_options(dpo, {"stop_at_pair_accuracy": 1}).stop_at_pair_accuracy == 1.0
    for bad in (0, 1.5, -0.1, "0.9", True):
        with pytest.raises(OptionsError) as raised:
            parse_options(dpo, {"stop_at_pair_accuracy": bad})
        assert raised.value.param == "stop_at_pair_accuracy"
    for method in ({"type": "supervised"}, {"type": "kto"}):
        with pytest.raises(OptionsError, match="needs DPO's pair accuracies"):
            parse_options(method, {"stop_at_pair_accuracy": 0.9})


def test_only_dpo_jobs_are_sent_the_agent_setting():
    params = PureTextAgentParameters(training_stop_at_pair_accuracy=0.95)
    assert lora_training_options(params, 32.0, 1e-4, "dpo")["stop_at_pair_accuracy"] == 0.95
    for method in ("supervised", "kto"):
        assert "stop_at_pair_accuracy" not in lora_training_options(params, 32.0, 1e-4, method)
    unset = PureTextAgentParameters()
    assert "stop_at_pair_accuracy" not in lora_training_options(unset, 32.0, 1e-4, "dpo")


def test_the_agent_setting_must_be_a_rate():
    for bad in (0.0, 1.01):
        with pytest.raises(ValueError, match="training_stop_at_pair_accuracy"):
            PureTextAgentParameters(training_stop_at_pair_accuracy=bad)


def test_an_epoch_is_fitted_on_its_mean_pair_accuracy():
    assert epoch_fitted([1.0, 1.0], 1.0)
    assert not epoch_fitted([1.0, 0.5], 1.0)
    assert epoch_fitted([1.0, 0.5, 1.0, 1.0], 0.875)
    assert not epoch_fitted([], 0.5)  # an epoch that logged nothing is not evidence


def _run_job(model: Path, job_dir: Path, stop_at: float | None) -> list[dict]:
    job_dir.mkdir()
    training_file = job_dir / "train.jsonl"
    training_file.write_text("".join(json.dumps(line) + "\n" for line in dpo_lines(4)))
    options = TrainingOptions(
        method="dpo",
        n_epochs=4,
        batch_size=1,
        learning_rate=1e-2,
        lora_rank=4,
        lora_dropout=0.0,
        seed=3,
        stop_at_pair_accuracy=stop_at,
    )
    config = {
        "options": options.to_dict(),
        "training_file": str(training_file),
        "base_model": str(model),
        "output_dir": str(job_dir / "output"),
    }
    (job_dir / "config.json").write_text(json.dumps(config))
    assert train_job.run(job_dir) == 0, (job_dir / "status.json").read_text()
    return read_events(job_dir)


def _steps(events: list[dict]) -> list[dict]:
    return [e["data"] for e in events if (e.get("data") or {}).get("step") and "loss" in e["data"]]


@pytest.mark.slow
def test_a_job_stops_after_the_first_fitted_epoch_and_says_so(tmp_path):
    model = build_tiny_model(tmp_path / "tiny")
    every = _steps(_run_job(model, tmp_path / "every-epoch", None))
    assert len(every) == 16  # 4 pairs, batch 1, 4 epochs
    events = _run_job(model, tmp_path / "stop", 0.75)
    stopped = [e for e in events if "stopped_after_epoch" in (e.get("data") or {})]
    assert len(stopped) == 1, [e["message"] for e in events]
    epoch = stopped[0]["data"]["stopped_after_epoch"]
    steps = _steps(events)
    # it stopped at that epoch's end, before the last epoch, on that epoch's mean accuracy
    assert 1 <= epoch < 4 and len(steps) == 4 * epoch
    last_epoch = [s["rewards/accuracies"] for s in steps[-4:]]
    assert sum(last_epoch) / 4 >= 0.75
    assert stopped[0]["data"]["epoch_pair_accuracy"] == pytest.approx(sum(last_epoch) / 4)
    assert "Stopping after epoch" in stopped[0]["message"]
    # the epochs before it did not reach the threshold (else it would have stopped there)
    for earlier in range(epoch - 1):
        accuracies = [s["rewards/accuracies"] for s in steps[4 * earlier : 4 * earlier + 4]]
        assert sum(accuracies) / 4 < 0.75
    # the same first epochs as the job that ran all of them: stopping changes nothing before
    assert [s["loss"] for s in steps] == pytest.approx([s["loss"] for s in every[: len(steps)]])
    assert (tmp_path / "stop" / "output" / "adapter_model.safetensors").is_file()
