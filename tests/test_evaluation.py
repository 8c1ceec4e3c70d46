"""Evaluation: sizing and selection, per-rollout rows and metrics, the test stage and its flow.

pytest tests/test_evaluation.py
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from flows.cli import resolve_hyper_params
from flows.evaluate import main as evaluate_main
from flows.malt_iteration import malt_iteration
from nip_core.episode import ACCEPT, Datapoint
from nip_core.malt import schemas
from nip_core.malt.evaluation import (
    evaluation_items,
    evaluation_metrics,
    evaluation_size,
    evaluation_table,
    label_balanced_items,
    should_evaluate,
)
from nip_core.malt.iteration_stats import verifier_metrics
from nip_core.run.iteration_context import build_context

# ------------------------------------------------------------------------------------------
# Pure functions


@pytest.mark.parametrize(
    ("scheme", "expected"),
    [
        ("none", [False, False, False]),
        ("all", [True, True, True]),
        ("last", [False, False, True]),
        ("first_and_last", [True, False, True]),
    ],
)
def test_should_evaluate_follows_the_test_scheme(scheme, expected):
    assert [should_evaluate(scheme, i, 3) for i in range(3)] == expected


def test_single_iteration_run_is_first_and_last():
    assert should_evaluate("last", 0, 1) and should_evaluate("first_and_last", 0, 1)


def test_unknown_test_scheme_is_named_in_the_error():
    with pytest.raises(ValueError, match="test_scheme.*'sometimes'"):
        should_evaluate("sometimes", 0, 3)


def test_evaluation_size_whole_split_or_rollouts_times_passes():
    kwargs = {"rollouts_per_iteration": 4, "num_test_iterations": 3}
    assert evaluation_size(10, whole_dataset=True, **kwargs) == 30
    assert evaluation_size(10, whole_dataset=False, **kwargs) == 12


@pytest.mark.parametrize(
    ("size", "passes", "message"),
    [(0, 1, "split is empty"), (5, 0, "num_test_iterations")],
)
def test_evaluation_size_rejects_bad_input(size, passes, message):
    with pytest.raises(ValueError, match=message):
        evaluation_size(
            size, whole_dataset=True, rollouts_per_iteration=2, num_test_iterations=passes
        )


def points(n: int) -> list[Datapoint]:
    return [Datapoint(i, f"q{i}", f"s{i}", i % 2, 1) for i in range(n)]


def test_evaluation_items_cover_the_split_evenly_and_are_reproducible():
    items = evaluation_items(points(7), 21, run_seed=3, split="test")
    counts = np.bincount([it.datapoint.id for it in items], minlength=7)
    assert counts.tolist() == [3] * 7
    assert [it.batch_index for it in items] == list(range(21))
    assert len({it.episode_seed for it in items}) == 21
    again = evaluation_items(points(7), 21, run_seed=3, split="test")
    assert again == items
    other_seed = evaluation_items(points(7), 21, run_seed=4, split="test")
    assert [it.datapoint.id for it in other_seed] != [it.datapoint.id for it in items]


def test_label_balanced_items_take_half_of_each_label_in_the_seeded_order():
    skewed = [
        Datapoint(i, f"q{i}", f"s{i}", int(i < 8), 1) for i in range(11)
    ]  # 8 correct, 3 buggy
    items = label_balanced_items(skewed, 16, run_seed=3, split="validation")
    labels = [it.datapoint.y for it in items]
    assert labels == [1, 0] * 8  # 8 of each, alternating; the 3 buggy ones read cyclically
    order = [it.datapoint.id for it in evaluation_items(skewed, 11, run_seed=3, split="validation")]
    correct = [i for i in order if i < 8]
    assert [it.datapoint.id for it in items if it.datapoint.y == 1] == correct
    plain = evaluation_items(skewed, 16, run_seed=3, split="validation")
    assert [it.episode_seed for it in items] == [it.episode_seed for it in plain]
    one_label = [Datapoint(i, "q", "s", 1, 1) for i in range(4)]
    assert label_balanced_items(one_label, 5, 3, "validation") == evaluation_items(
        one_label, 5, 3, "validation"
    )


# A hand-built nodes table: three single-chain rollouts.
#   b0: verifier accepts a correct solution at round 1 (correct)
#   b1: verifier accepts a buggy solution at round 0 (wrong; a false positive)
#   b2: no decision after round 1 and a failed call (wrong)
def node(batch, node_id, parent, round_, y, decision=None, rewards=(), failure=None, end=False):
    return {
        "datapoint_id": 100 + batch,
        "batch_index": batch,
        "node_id": node_id,
        "parent_id": parent,
        "round": round_,
        "messages": [],
        "raw_messages": [],
        "acted": [],
        "decision": decision,
        "y": y,
        "ended": end,
        "terminated": False,
        "step_rewards": [{"agent": a, "reward": r} for a, r in rewards],
        "retries": 0,
        "failure": failure,
    }


NODES = pa.Table.from_pylist(
    [
        node(0, "b0", None, -1, 1),
        node(0, "b0.0", "b0", 0, 1, rewards=[("prover", 0.0)]),
        node(0, "b0.0.0", "b0.0", 1, 1, ACCEPT, [("prover", 1.0), ("verifier", 1.0)], end=True),
        node(1, "b1", None, -1, 0),
        node(1, "b1.0", "b1", 0, 0, ACCEPT, [("prover", 1.0), ("verifier", -1.0)], end=True),
        node(2, "b2", None, -1, 0),
        node(2, "b2.0", "b2", 0, 0, failure="prover: timeout"),
        node(2, "b2.0.0", "b2.0", 1, 0, rewards=[("verifier", -0.5)], end=True),
    ],
    schema=schemas.NODES,
)


def test_evaluation_table_has_one_row_per_rollout_with_path_sums():
    table = evaluation_table(
        NODES, ["prover", "verifier"], iteration=2, protocol="nip", split="test"
    ).to_pandas()
    assert table["leaf_node_id"].tolist() == ["b0.0.0", "b1.0", "b2.0.0"]
    by_leaf = table.set_index("leaf_node_id")
    assert by_leaf.loc["b0.0.0", "rounds"] == 2 and by_leaf.loc["b1.0", "rounds"] == 1
    assert by_leaf["correct"].tolist() == [True, False, False]
    assert pd.isna(by_leaf.loc["b2.0.0", "decision"])
    assert by_leaf.loc["b2.0.0", "failure"] == "prover: timeout"
    rewards = {
        leaf: {r["agent"]: r["reward"] for r in row}
        for leaf, row in by_leaf["episode_rewards"].items()
    }
    assert rewards["b0.0.0"] == {"prover": 1.0, "verifier": 1.0}
    assert rewards["b2.0.0"] == {"prover": 0.0, "verifier": -0.5}
    assert set(table["iteration"]) == {2} and set(table["protocol"]) == {"nip"}


def test_evaluation_metrics_match_the_training_definitions():
    table = evaluation_table(
        NODES, ["prover", "verifier"], iteration=0, protocol="nip", split="test"
    )
    metrics = evaluation_metrics(table, ["prover", "verifier"])
    assert metrics["accuracy"] == pytest.approx(1 / 3)
    assert metrics["precision"] == pytest.approx(1 / 2)  # one of two accepts is right
    assert metrics["recall"] == 1.0
    assert metrics["decision_rate"] == pytest.approx(2 / 3)
    assert metrics["accuracy_y1"] == 1.0 and metrics["accuracy_y0"] == 0.0
    assert metrics["mean_episode_length"] == pytest.approx(5 / 3)
    assert metrics["failures"] == 1
    assert metrics["agents"]["verifier"]["mean_episode_reward"] == pytest.approx(-0.5 / 3)
    reference = verifier_metrics(np.array([ACCEPT, ACCEPT, -1]), np.array([0, 1, 0]))
    assert {k: metrics[k] for k in reference} == reference


def test_metrics_without_accepts_report_none_not_nan():
    table = evaluation_table(
        NODES.filter(pa.compute.equal(NODES.column("batch_index"), 2)),
        ["prover", "verifier"],
        iteration=0,
        protocol="nip",
        split="test",
    )
    metrics = evaluation_metrics(table, ["prover", "verifier"])
    assert metrics["precision"] is None and metrics["recall"] is None
    assert metrics["accuracy_y1"] is None
    assert metrics["accuracy"] == 0.0 and metrics["decision_rate"] == 0.0


# ------------------------------------------------------------------------------------------
# The stage inside the iteration flow, and flows.evaluate on its own

SMALL = [
    "agents._default.use_dummy_api=true",
    "rl.rollouts_per_iteration=2",
    "rl.num_iterations=2",
    "rl.num_test_iterations=2",
    "dataset_options.max_test_size=5",
    "dataset_options.max_train_size=6",
    "nip_protocol.max_message_rounds=3",
]


def iteration_dir(root: Path, run: str, iteration: int) -> Path:
    return root / run / "iterations" / f"{iteration:04d}"


def manifest(root: Path, run: str, iteration: int) -> dict:
    return json.loads((iteration_dir(root, run, iteration) / "manifest.json").read_text())


def test_default_scheme_runs_no_evaluation(prefect_harness, tmp_path):
    stats = malt_iteration(
        overrides=SMALL[:2], run_name="n", artifacts_root=str(tmp_path), use_wandb=False
    )
    assert "eval" not in stats
    assert not (iteration_dir(tmp_path, "n", 0) / "eval.parquet").exists()
    assert "evaluate" not in manifest(tmp_path, "n", 0)["stages"]


def test_an_unchanged_model_is_not_asked_again_in_a_later_evaluation(prefect_harness, tmp_path):
    """Evaluation call seeds ignore the iteration, so iteration 1 replays iteration 0's calls of
    the models that did not change (here both agents are frozen): its journal stays empty."""
    frozen = ["agents.prover.freeze_agent=true", "agents.verifier.freeze_agent=true"]
    overrides = [*SMALL, "text_rl.test_scheme=all", *frozen]
    for iteration in (0, 1):
        malt_iteration(
            overrides=overrides,
            run_name="f",
            artifacts_root=str(tmp_path),
            iteration=iteration,
            use_wandb=False,
        )
    first, second = (iteration_dir(tmp_path, "f", i) for i in (0, 1))
    asked = [p.read_text() for p in second.glob("eval-calls-*.jsonl")]
    assert list(first.glob("eval-calls-*.jsonl")) and not "".join(asked)
    columns = ["datapoint_id", "decision", "y"]
    again = pd.read_parquet(second / "eval.parquet")[columns]
    assert again.equals(pd.read_parquet(first / "eval.parquet")[columns])


def test_test_stage_in_iteration_then_standalone_flow(prefect_harness, tmp_path, capsys):
    overrides = [*SMALL, "text_rl.test_scheme=first_and_last"]
    stats = malt_iteration(
        overrides=overrides, run_name="e", artifacts_root=str(tmp_path), use_wandb=False
    )
    it0 = iteration_dir(tmp_path, "e", 0)
    rows = pd.read_parquet(it0 / "eval.parquet")
    # whole (reduced) test split of 5, two passes, one sample per turn: 10 chains
    assert len(rows) == 10 and rows["batch_index"].tolist() == list(range(10))
    assert rows["datapoint_id"].value_counts().tolist() == [2] * 5
    nodes = pd.read_parquet(it0 / "eval-nodes.parquet")
    assert nodes.groupby("parent_id").size().max() == 1  # no branching
    # Metrics in the stats, the manifest and recomputed from the file all agree.
    recorded = manifest(tmp_path, "e", 0)["stages"]["evaluate"]["info"]
    assert stats["eval"] == recorded
    decisions = rows["decision"].fillna(-1).to_numpy()
    assert recorded["accuracy"] == pytest.approx(float(np.mean(decisions == rows["y"])))
    assert recorded["rollouts"] == 10 and recorded["protocol"] == "nip"
    # Run before fine-tuning: it measured the models this iteration generated with.
    models_after = manifest(tmp_path, "e", 0)["models_after"]
    base = build_context(resolve_hyper_params(None, overrides), "e", 0).models
    assert recorded["models"] == dict(base)
    assert (it0 / "eval-calls-0.jsonl").exists()

    # Stand-alone: iteration 1's models are the ones iteration 0 switched to.
    args = [*(f"--set={o}" for o in overrides), "--run-name", "e"]
    args += ["--artifacts-root", str(tmp_path), "--no-wandb"]
    assert evaluate_main([*args, "--iteration", "1"]) == 0
    it1 = manifest(tmp_path, "e", 1)["stages"]["evaluate"]["info"]
    assert it1["models"] == {agent: models_after[agent] for agent in ("prover", "verifier")}
    assert "test evaluation" in capsys.readouterr().out

    # Train split goes to its own files; a repeated evaluation replays instead of calling.
    assert evaluate_main([*args, "--iteration", "0", "--split", "train"]) == 0
    train_rows = pd.read_parquet(it0 / "eval-train.parquet")
    assert len(train_rows) == 6 * 2 and set(train_rows["split"]) == {"train"}
    journal = it0 / "eval-calls-0.jsonl"
    before = journal.read_text()
    (it0 / "eval.parquet").unlink()
    assert evaluate_main([*args, "--iteration", "0"]) == 0
    assert journal.read_text() == before
    assert pd.read_parquet(it0 / "eval.parquet").equals(rows)


def test_standalone_evaluation_of_an_iteration_not_reached_is_refused(
    prefect_harness, tmp_path, capsys
):
    args = ["--set=agents._default.use_dummy_api=true", "--artifacts-root", str(tmp_path)]
    assert evaluate_main([*args, "--run-name", "fresh", "--iteration", "3", "--no-wandb"]) == 2
    assert "iteration 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate_main([*args, "--split", "dev"])
    assert "invalid choice: 'dev'" in capsys.readouterr().err
    no_validation = ["--set=text_rl.validation_fraction=0", "--set=text_rl.switch_guard=false"]
    assert evaluate_main([*args, *no_validation, "--split", "validation", "--no-wandb"]) == 2
    assert "text_rl.validation_fraction" in capsys.readouterr().err


def test_judging_metrics_by_hand():
    from nip_core.malt.evaluation import judging_metrics

    table = pa.table(
        {
            "datapoint_id": [1, 1, 2, 2],
            "decision": pa.array([1, None, 1, 0], pa.int64()),
            "y": [1, 1, 0, 0],
            "correct": [True, False, False, True],
        }
    )
    metrics = judging_metrics(table, resamples=200)
    assert metrics["accuracy_when_decided"] == pytest.approx(2 / 3)
    assert metrics["accept_rate"] == pytest.approx(2 / 3)
    assert metrics["balanced_accuracy"] == pytest.approx(0.5)
    assert metrics["accuracy_ci_low"] <= 0.5 <= metrics["accuracy_ci_high"]
