"""MALT's group-relative objective (`pure_text_malt.training_objective: kto`): which sampled
replies are marked desirable, what the export writes, and who can train it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nip_core.malt.group_relative import marked_replies
from nip_core.parameters import HyperParameters, apply_overrides


def test_replies_are_marked_against_their_siblings_mean():
    """Root 0 has four verifier replies (1-4) worth 1, 1, -1, 0: mean 0.25, so 1 and 2 are
    desirable, 3 and 4 not. Node 5's two children tie: they say nothing. Node 8 is the only
    child its parent has."""
    parent = np.array([-1, 0, 0, 0, 0, -1, 5, 5, -1, 8])
    value = np.array([[0], [1.0], [1.0], [-1.0], [0.0], [0], [1.0], [1.0], [0], [1.0]])
    acted = np.array([[False]] + [[True]] * 4 + [[False], [True], [True], [False], [True]])
    every = marked_replies(parent, value, acted, rows_per_parent=10, seed=0)
    assert every.node.tolist() == [1, 2, 3, 4]
    assert every.desirable.tolist() == [True, True, False, False]
    assert every.advantage.tolist() == [0.75, 0.75, -1.25, -0.25]
    two = marked_replies(parent, value, acted, rows_per_parent=2, seed=0)
    assert sorted(two.desirable.tolist()) == [False, True]  # one of each kind
    lopsided = np.array([[0], [1.0], [1.0], [1.0], [-1.0], [0], [1.0], [1.0], [0], [1.0]])
    three = marked_replies(parent, lopsided, acted, rows_per_parent=3, seed=0)
    assert sorted(three.desirable.tolist()) == [False, True, True]  # the one undesirable kept


def kto_iteration(tmp_path: Path, *overrides: str) -> Path:
    from flows.malt_iteration import malt_iteration

    base = [
        "agents._default.use_dummy_api=true",
        "interaction_protocol=solo_verifier",
        "rl.rollouts_per_iteration=12",
        "pure_text_malt.num_responses_per_timestep=6",
        "pure_text_malt.training_objective=kto",
        "pure_text_malt.kto_rows_per_parent=4",
    ]
    malt_iteration([*base, *overrides], run_name="kto", artifacts_root=str(tmp_path))
    folder = tmp_path / "kto" / "iterations" / "0000"
    return folder


def test_the_export_writes_the_verifiers_own_replies_marked_by_their_advantage(
    prefect_harness, tmp_path
):
    folder = kto_iteration(tmp_path)
    rows = pd.read_parquet(folder / "datasets" / "kto" / "verifier.parquet")
    nodes = pd.read_parquet(folder / "nodes.parquet").set_index("node_id")
    assert len(rows) > 0 and rows["label"].any() and (~rows["label"]).any()
    assert (rows["label"] == (rows["advantage"] > 0)).all() and (rows["advantage"] != 0).all()
    assert rows.groupby("parent_node_id").size().max() <= 4
    for _, row in rows.iterrows():  # every answer is a reply the model sampled, none written
        raw = {m["agent"]: m["content"] for m in nodes.loc[row["node_id"], "raw_messages"]}
        assert row["completion"][0]["content"] == raw["verifier"]
        assert nodes.loc[row["node_id"], "parent_id"] == row["parent_node_id"]
    lines = (folder / "datasets" / "kto" / "verifier.jsonl").read_text().splitlines()
    assert len(lines) == len(rows) and '"label": ' in lines[0]


def test_the_verifiers_rows_are_balanced_by_the_codes_label(prefect_harness, tmp_path):
    folder = kto_iteration(tmp_path, "pure_text_malt.balance_verifier_by_label=true")
    rows = pd.read_parquet(folder / "datasets" / "kto" / "verifier.parquet")
    y = pd.read_parquet(folder / "batch.parquet").set_index("datapoint_id")["y"]
    counts = rows["datapoint_id"].map(y).value_counts()
    assert len(counts) == 2 and counts[0] == counts[1]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["agents._default.use_dummy_api=false"], "uses OpenAI, whose fine-tuning API has no KTO"),
        (
            ["agents._default.model_provider=SelfHosted", "agents._default.use_dummy_api=false",
             "agents._default.per_device_train_batch_size=1"],
            "per_device_train_batch_size >= 2",
        ),
        (
            ["pure_text_malt.verifier_training_signal=label_pairs",
             "text_rl.verifier_guess_replacement_proportion=1.0"],
            "writes label pairs",
        ),
    ],
)  # fmt: skip
def test_kto_is_refused_up_front_where_it_cannot_train(overrides, message):
    hp = HyperParameters.construct_test_params()
    with pytest.raises(ValueError, match=message):
        apply_overrides(hp, ["pure_text_malt.training_objective=kto", *overrides])


@pytest.mark.slow
def test_the_exported_kto_file_trains_on_our_server_path(prefect_harness, tmp_path):
    """The export's JSONL, parsed as our server parses it, trains a tiny model through
    `training.build_trainer` (TRL's KTOTrainer), weights set from its labels."""
    import torch

    from nip_core.lm_server import training
    from nip_core.lm_server.dataset_stats import trainer_dataset_event
    from nip_core.lm_server.datasets import parse_dataset
    from nip_core.lm_server.options import TrainingOptions
    from tests.tiny_model import build_tiny_model

    folder = kto_iteration(tmp_path / "run")
    rows = parse_dataset((folder / "datasets" / "kto" / "verifier.jsonl").read_text(), "kto")
    model_dir = build_tiny_model(tmp_path / "tiny")
    options = TrainingOptions(method="kto", batch_size=2, learning_rate=0.01, lora_rank=4)
    tokenizer = training.load_tokenizer(str(model_dir))
    model, peft, _ = training.load_for_training(str(model_dir), None, options)
    trainer = training.build_trainer(options, model, tokenizer, rows, str(tmp_path / "o"), peft)
    assert trainer.desirable_weight * sum(r["label"] for r in rows) == pytest.approx(
        trainer.undesirable_weight * sum(not r["label"] for r in rows)
    )
    before = [p.detach().clone() for p in trainer.model.parameters() if p.requires_grad]
    assert trainer.train().global_step >= 1
    after = [p for p in trainer.model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, after, strict=True))
    stats = trainer_dataset_event(trainer, rows, "kto")
    assert stats["examples"] == len(rows) and stats["tokens"]["completion"]["max"] > 0
