"""Training diagnostics end to end: a real training child on a tiny model sends the dataset and
per-step events, and the fine-tune stage reads a job's events page by page over HTTP from the
server (dummy engine) into the steps file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import openai
import pytest

from nip_core.lm_server import train_job, training
from nip_core.lm_server.dataset_stats import trainer_dataset_event
from nip_core.lm_server.datasets import parse_dataset
from nip_core.lm_server.options import TrainingOptions
from nip_core.lm_server.store import append_event, read_events
from nip_core.run.artifacts import RunPaths
from nip_core.training.fine_tune_jobs import GroupState
from nip_core.training.job_diagnostics import (
    fetch_events,
    read_steps,
    record_training_diagnostics,
)
from tests.conftest_lm import dpo_lines, running_server, upload, wait_job
from tests.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow
DPO_KEYS = {"loss", "logps/chosen", "logps/rejected", "rewards/margins", "rewards/accuracies"}


def line(prompt_repeats: int, answer_repeats: int) -> dict:
    """A DPO line; 300 prompt repeats exceed the tiny model's context of 2,048 tokens, the
    max_length the trainer is given (TRL's own default, 1,024, would cut the verdict off)."""
    question = [{"role": "user", "content": "Is 3+3=6? " * prompt_repeats}]
    return {
        "input": {"messages": [{"role": "system", "content": "sys"}, *question]},
        "preferred_output": [{"role": "assistant", "content": "Yes, accept. " * answer_repeats}],
        "non_preferred_output": [{"role": "assistant", "content": "No, reject it."}],
    }


LINES = [line(2, 1), line(3, 2), line(5, 3), line(6, 4), line(300, 1), line(400, 1)]
LONGER_THAN_TRL_DEFAULT = line(140, 1)  # ~1,120 tokens: over 1,024, inside the context
OPTIONS = TrainingOptions(method="dpo", batch_size=2, learning_rate=0.01, lora_rank=4)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def test_counts_match_what_the_dpo_trainer_tokenized(tiny_model, tmp_path):
    rows = parse_dataset("\n".join(json.dumps(x) for x in LINES), "dpo")
    tokenizer = training.load_tokenizer(str(tiny_model))
    model, peft, _ = training.load_for_training(str(tiny_model), None, OPTIONS)
    trainer = training.build_trainer(OPTIONS, model, tokenizer, rows, str(tmp_path), peft)
    stats = trainer_dataset_event(trainer, rows, "dpo")
    kept = trainer.train_dataset  # TRL dropped the two whose prompt alone fills max_length
    assert stats["kept"] == len(kept) == 4 and stats["truncated"] == 2
    assert stats["max_length"] == 2048 and stats["truncation_mode"] == "keep_start"
    for ours, column in (("prompt", "prompt_ids"), ("completion", "chosen_ids")):
        assert stats["per_example"][ours][:4] == [len(ids) for ids in kept[column]]
    assert stats["per_example"]["rejected"][:4] == [len(ids) for ids in kept["rejected_ids"]]


def test_a_row_longer_than_trls_default_is_trained_whole(tiny_model, tmp_path):
    rows = parse_dataset(json.dumps(LONGER_THAN_TRL_DEFAULT), "dpo")
    tokenizer = training.load_tokenizer(str(tiny_model))
    model, peft, _ = training.load_for_training(str(tiny_model), None, OPTIONS)
    trainer = training.build_trainer(OPTIONS, model, tokenizer, rows, str(tmp_path), peft)
    stats = trainer_dataset_event(trainer, rows, "dpo")
    assert stats["per_example"]["sequence"][0] > 1024 and stats["truncated"] == 0
    (kept,) = trainer.train_dataset
    assert len(kept["chosen_ids"]) == stats["per_example"]["completion"][0]  # the verdict kept


def test_sft_sequence_lengths_match_the_sft_trainer(tiny_model, tmp_path):
    lines = [x["input"]["messages"] + x["preferred_output"] for x in LINES[:4]]
    rows = parse_dataset("\n".join(json.dumps({"messages": m}) for m in lines), "supervised")
    options = TrainingOptions(method="supervised", batch_size=2, lora_rank=4)
    tokenizer = training.load_tokenizer(str(tiny_model))
    model, peft, _ = training.load_for_training(str(tiny_model), None, options)
    trainer = training.build_trainer(options, model, tokenizer, rows, str(tmp_path), peft)
    stats = trainer_dataset_event(trainer, rows, "supervised")
    tokenized = [len(ids) for ids in trainer.train_dataset["input_ids"]]
    assert stats["per_example"]["sequence"] == tokenized and stats["truncated"] == 0
    assert stats["max_length"] == 2048 and stats["kept"] == 4


def test_reference_logps_computed_once_train_exactly_as_in_every_step(
    tiny_model, tmp_path, monkeypatch
):
    """Precomputing the reference's log-probabilities changes the cost, not the training (LoRA
    dropout off: the precompute pass draws from the RNG, so dropout masks would differ)."""
    rows = parse_dataset("\n".join(json.dumps(x) for x in LINES[:4]), "dpo")
    options = TrainingOptions(
        method="dpo",
        batch_size=2,
        learning_rate=0.01,
        lora_rank=4,
        lora_dropout=0.0,
        n_epochs=2,
        precision="fp32",  # the same sums either way; bf16 rounds them by the batch's shape
    )

    def losses(precompute: bool) -> list[float]:
        monkeypatch.setattr(training, "PRECOMPUTE_REFERENCE_LOGPS", precompute)
        tokenizer = training.load_tokenizer(str(tiny_model))
        model, peft, _ = training.load_for_training(str(tiny_model), None, options)
        out = tmp_path / str(precompute)
        trainer = training.build_trainer(options, model, tokenizer, rows, str(out), peft)
        assert ("ref_chosen_logps" in trainer.train_dataset.column_names) is precompute
        trainer.train()
        logs = [e for e in trainer.state.log_history if "rewards/margins" in e]
        return [e[key] for e in logs for key in ("loss", "rewards/margins")]

    every_step, once = losses(False), losses(True)
    assert len(every_step) == 8  # 2 epochs of 2 steps, a loss and a margin each
    assert once == pytest.approx(every_step, rel=1e-4, abs=1e-6)
    assert any(margin != 0 for margin in once[3::2])  # it trained


@pytest.mark.parametrize("asked", [True, False])
def test_the_trainer_checkpoints_activations_as_asked(tiny_model, tmp_path, asked):
    """Said both ways: TRL's configs default to checkpointing, so "no" must be said too."""
    rows = parse_dataset("\n".join(json.dumps(x) for x in LINES[:2]), "dpo")
    options = TrainingOptions(method="dpo", lora_rank=4, activation_checkpointing=asked)
    tokenizer = training.load_tokenizer(str(tiny_model))
    model, peft, _ = training.load_for_training(str(tiny_model), None, options)
    trainer = training.build_trainer(options, model, tokenizer, rows, str(tmp_path), peft)
    assert trainer.args.gradient_checkpointing is asked


def test_training_child_sends_dataset_and_dpo_step_events(tiny_model, tmp_path):
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in LINES))
    config = {
        "base_model": str(tiny_model),
        "parent_adapter": None,
        "options": OPTIONS.to_dict(),
        "training_file": str(tmp_path / "train.jsonl"),
        "output_dir": str(tmp_path / "output"),
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert train_job.run(tmp_path) == 0
    events = read_events(tmp_path)
    dataset = [e for e in events if (e["data"] or {}).get("kind") == "dataset"]
    assert len(dataset) == 1 and dataset[0]["message"].startswith("Dataset: 6 examples")
    assert dataset[0]["data"]["truncated"] == 2 and dataset[0]["data"]["kept"] == 4
    steps = [e["data"] for e in events if "loss" in (e["data"] or {})]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(DPO_KEYS <= set(s) for s in steps)


def test_stage_reads_every_page_of_a_served_job(tmp_path):
    state = tmp_path / "state"
    with running_server(["--engine", "dummy"], state) as server:
        sync = server.client()
        job = sync.fine_tuning.jobs.create(
            model=sync.models.list().data[0].id,
            training_file=upload(sync, dpo_lines(2)).id,
            method={"type": "dpo"},
        )
        done = wait_job(sync, job.id)
        assert done.status == "succeeded", done.error
        job_dir = state / "jobs" / job.id  # fake training logs no metrics: add some steps
        append_event(job_dir, "Dataset", data={"kind": "dataset", "examples": 2, "kept": 2})
        for step in range(1, 8):
            append_event(job_dir, f"Step {step}", data={"step": step, "loss": 1.0 / step})

        async def read():
            client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
            group = SimpleNamespace(
                name="verifier", client=client, state=GroupState(fine_tune_job_id=job.id)
            )
            try:
                events = await fetch_events(client, job.id, page_size=3)
                paths = RunPaths.open(str(tmp_path / "art"), "run")
                return events, paths, await record_training_diagnostics(paths, 0, group)
            finally:
                await client.close()

        events, paths, summary = asyncio.run(read())
    assert len(events) == len(read_events(job_dir)) > 9
    assert summary["steps"] == 7 and summary["last_loss"] == pytest.approx(1 / 7)
    assert summary["dropped"] == 0
    steps, dataset, job_id = read_steps(
        paths.fs, paths.iteration_file(0, "fine_tune/verifier-steps.parquet")
    )
    assert steps["step"].tolist() == list(range(1, 8)) and job_id == job.id
