"""An exported DPO file feeds `trl.DPOTrainer` unchanged (one optimisation step, tiny model)."""

import pytest

from flows.malt_iteration import malt_iteration
from tests.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow


def test_exported_dpo_parquet_trains_one_trl_step(prefect_harness, tmp_path):
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer
    from trl.data_utils import is_conversational

    malt_iteration(
        overrides=["agents._default.use_dummy_api=true", "rl.rollouts_per_iteration=6"],
        run_name="dpo",
        artifacts_root=str(tmp_path / "art"),
    )
    path = (
        tmp_path / "art" / "dpo" / "iterations" / "0000" / "datasets" / "dpo" / "verifier.parquet"
    )
    dataset = datasets.load_dataset("parquet", data_files=str(path), split="train")
    assert len(dataset) > 0 and is_conversational(dataset[0])

    model_dir = build_tiny_model(tmp_path / "tiny")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    before = [p.detach().clone() for p in model.parameters()]
    config = DPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        max_length=2048,
    )
    trainer = DPOTrainer(
        model=model, args=config, train_dataset=dataset, processing_class=tokenizer
    )
    result = trainer.train()
    assert result.global_step == 1
    assert any(
        not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True)
    )
