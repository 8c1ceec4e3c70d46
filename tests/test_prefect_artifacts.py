"""Prefect artifacts of an iteration (table, markdown, link, progress) and the run-folder lock.

pytest tests/test_prefect_artifacts.py
"""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from prefect.artifacts import Artifact

from flows import malt_iteration as iteration_module
from flows.malt_iteration import malt_iteration
from nip_core.report.summary_markdown import summary_markdown, table_rows
from nip_core.run.artifacts import RunPaths, write_json
from nip_core.run.lock import LOCK_NAME, RunLockedError, run_lock
from tasks.prefect_ui import artifact_key, publish_iteration_artifacts, run_folder_url

SMALL = [
    "agents._default.use_dummy_api=true",
    "rl.rollouts_per_iteration=4",
    "text_rl.rollout_shard_size=2",
]


def fake_stats(with_eval: bool) -> dict:
    stats = {
        "datapoints": 4,
        "nodes": 36,
        "nodes_per_datapoint": 9.0,
        "rollouts": 20,
        "failures": 0,
        "verifier": {"accuracy": 0.35, "precision": 0.5, "recall": 0.25, "decision_rate": 0.9},
        "agents": {
            "prover": {
                "active_nodes": 12,
                "pairs": 2,
                "pair_proportion": 0.125,
                "mean_expected_reward": 0.123456789,
            },
            "verifier": {
                "active_nodes": 24,
                "pairs": 5,
                "pair_proportion": 0.3125,
                "mean_expected_reward": None,
            },
        },
        "models_after": {"prover": "ft:prover:it0", "verifier": "ft:verifier:it0"},
    }
    if with_eval:
        stats["eval"] = {"split": "test", "accuracy": 0.6, "precision": None, "recall": 0.0}
    return stats


def fake_context(run_name="Exp_1", iteration=2):
    protocol = SimpleNamespace(name="nip", verifier_name="verifier", max_message_rounds=4)
    return SimpleNamespace(
        run_name=run_name, iteration=iteration, protocol=protocol, is_ei_iteration=False
    )


def test_artifact_keys_are_lowercase_dashes():
    assert artifact_key("Exp_1.b", "iteration-table") == "exp-1-b-iteration-table"
    assert artifact_key("run", "iteration-0003-rollouts") == "run-iteration-0003-rollouts"


def test_table_has_one_row_per_agent_and_verifier_metrics_on_the_verifier_row():
    rows = table_rows(fake_stats(with_eval=False))
    assert [r["agent"] for r in rows] == ["prover", "verifier"]
    prover, verifier = rows
    assert prover["nodes"] == verifier["nodes"] == 36
    assert (prover["active_nodes"], prover["pairs"], prover["pair_proportion"]) == (12, 2, 0.125)
    assert prover["mean_expected_reward"] == 0.1235
    assert verifier["mean_expected_reward"] is None
    assert (verifier["train_accuracy"], verifier["train_recall"]) == (0.35, 0.25)
    assert prover["train_accuracy"] is None
    assert not any(key.startswith("test_") for key in verifier)


def test_table_adds_test_metrics_when_the_iteration_was_evaluated():
    verifier = table_rows(fake_stats(with_eval=True))[1]
    assert (verifier["test_accuracy"], verifier["test_precision"]) == (0.6, None)
    assert verifier["test_recall"] == 0.0


def test_markdown_names_models_files_and_numbers(tmp_path):
    paths = RunPaths.open(str(tmp_path), "Exp_1")
    manifest = {
        "stages": {
            "rollouts/shard-00000": {"files": {"shards/nodes-00000.parquet": "x"}},
            "rollouts": {"files": {"nodes.parquet": "x"}},
            "export": {"files": {"datasets/prover.parquet": "y"}},
        }
    }
    write_json(paths.fs, paths.manifest(2), manifest)
    text = summary_markdown(paths, fake_context(), fake_stats(with_eval=True))
    assert "iteration 2" in text and "`ft:verifier:it0`" in text
    assert f"{paths.run_dir}/iterations/0002/nodes.parquet" in text
    assert "datasets/prover.parquet" in text and "shard" not in text
    assert "| test verifier accuracy | 0.600 |" in text
    assert "| train verifier precision | 0.500 |" in text


def test_run_folder_url_local_and_remote(tmp_path):
    local = RunPaths.open(str(tmp_path), "r")
    assert run_folder_url(local) == f"file://{tmp_path}/r"
    remote = RunPaths.open("memory://bucket/root", "r")
    assert run_folder_url(remote) == "memory:///bucket/root/r"


def test_publish_outside_a_flow_run_does_nothing(tmp_path):
    paths = RunPaths.open(str(tmp_path), "r")
    assert publish_iteration_artifacts(paths, fake_context(), fake_stats(False)) == {}


def test_iteration_publishes_table_summary_link_and_progress(prefect_harness, tmp_path):
    run = "Art_Run"
    stats = malt_iteration(overrides=SMALL, run_name=run, artifacts_root=str(tmp_path))

    table = Artifact.get("art-run-iteration-table")
    rows = json.loads(table.data)
    assert {r["agent"] for r in rows} == set(stats["agents"])
    for row in rows:
        agent_stats = stats["agents"][row["agent"]]
        assert row["nodes"] == stats["nodes"]
        assert row["active_nodes"] == agent_stats["active_nodes"]
        assert row["pairs"] == agent_stats["pairs"]
    verifier_row = next(r for r in rows if r["agent"] == "verifier")
    accuracy = stats["verifier"]["accuracy"]
    assert verifier_row["train_accuracy"] == pytest.approx(accuracy, abs=1e-4)

    summary = Artifact.get("art-run-iteration-summary").data
    for model in stats["models_after"].values():
        assert model in summary
    assert f"{tmp_path}/{run}/iterations/0000/nodes.parquet" in summary

    link = Artifact.get("art-run-run-folder")
    assert link.type == "markdown"  # Prefect stores links as markdown "[text](url)"
    assert f"(file://{tmp_path}/{run})" in link.data

    progress = Artifact.get("art-run-iteration-0000-rollouts")
    assert progress.type == "progress" and float(progress.data) == 100.0
    assert not (tmp_path / run / LOCK_NAME).exists()  # lock released


def test_locked_run_folder_fails_the_flow_and_main_prints_one_error(
    prefect_harness, tmp_path, capsys
):
    run_dir = tmp_path / "busy"
    with run_lock(run_dir):
        with pytest.raises(RunLockedError, match="in use by pid"):
            malt_iteration(overrides=SMALL, run_name="busy", artifacts_root=str(tmp_path))
        code = iteration_module.main(
            ["--set", SMALL[0], "--run-name", "busy", "--artifacts-root", str(tmp_path)]
        )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: run folder") and "pid" in err[0]
    assert not (run_dir / "hyper_params.json").exists()  # nothing written while locked


def test_malt_run_cli_reports_a_locked_folder(tmp_path):
    """A live lock held by another process: `python -m flows.malt_run` exits 2 with one line."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom nip_core.run.lock import run_lock\n"
            "with run_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n",
            str(tmp_path / "r"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        result = subprocess.run(
            [sys.executable, "-m", "flows.malt_run", "--set", SMALL[0]]
            + ["--run-name", "r", "--artifacts-root", str(tmp_path), "--no-wandb"],
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"error: run folder {tmp_path / 'r'} is in use by pid {holder.pid}" in result.stderr
