"""`flows.experiment` end to end on the dummy backend: files, columns, resume, bad arms."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flows.experiment import main as experiment_main
from nip_core.experiment.stats import EXPERIMENT_COLUMNS, SUMMARY_COLUMNS

CONFIG = {
    "scenario": "code_validation",
    "trainer": "pure_text_malt",
    "dataset": "humaneval-buggy",
    "interaction_protocol": "solo_verifier",
    "seed": 11,
    "agents": {"_default": {"use_dummy_api": True}},
    "rl": {"rollouts_per_iteration": 6},
    "dataset_options": {"max_test_size": 10},
    "pure_text_malt": {"num_responses_per_timestep": 2},
    "experiment": {
        "iterations": 2,
        "samples_per_test_datapoint": 2,
        "bootstrap_resamples": 100,
        "arms": {"malt": {}, "malt_all_pairs": {"pure_text_malt.pairs_per_parent": "all"}},
    },
}


def write_config(tmp_path: Path, config: dict) -> str:
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "lock" not in p.name and p.suffix in (".parquet", ".jsonl")
    }


def test_two_arms_two_iterations_write_the_documented_files(prefect_harness, tmp_path, capsys):
    args = ["--config", write_config(tmp_path, CONFIG), "--artifacts-root", str(tmp_path)]
    assert experiment_main([*args, "--run-name", "exp", "--no-wandb"]) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "exp"
    for name in ("experiment.parquet", "summary.parquet", "experiment.html", "experiment.png"):
        assert (folder / name).stat().st_size > 0, name
    assert (folder / "arms" / "malt" / "iterations" / "0001" / "eval.parquet").exists()
    assert (folder / "base" / "iterations" / "0000" / "eval.parquet").exists()
    experiment = pd.read_parquet(folder / "experiment.parquet")
    summary = pd.read_parquet(folder / "summary.parquet")
    assert list(experiment.columns) == list(EXPERIMENT_COLUMNS)
    assert list(summary.columns[: len(SUMMARY_COLUMNS)]) == list(SUMMARY_COLUMNS)
    # 10 test datapoints x 2 samples per (arm, iteration): base + 2 arms x 2 iterations
    assert len(experiment) == 20 * 5
    assert set(experiment["sample"]) == {0, 1}
    assert summary[["arm", "iteration"]].values.tolist() == [
        [arm, it] for arm in ("malt", "malt_all_pairs") for it in (0, 1, 2)
    ]
    for row in summary.itertuples():
        arm = "base" if row.iteration == 0 else row.arm
        rows = experiment[(experiment.arm == arm) & (experiment.iteration == row.iteration)]
        assert row.accuracy == pytest.approx(rows["correct"].mean())
        assert row.decision_rate == pytest.approx(rows["decided"].mean())
    trained = summary[summary.iteration > 0]
    assert (trained.train_model_calls == 6 * 2).all()  # datapoints x K, one turn each
    assert (trained.wall_seconds >= 0).all()
    assert "malt_all_pairs" in out and "acc - base" in out

    before = digests(folder)
    assert experiment_main([*args, "--run-name", "exp", "--no-wandb"]) == 0
    assert digests(folder) == before  # nothing regenerated, no call journal grew


def test_an_invalid_arm_override_fails_before_anything_runs(tmp_path, capsys):
    config = dict(CONFIG, experiment=dict(CONFIG["experiment"], arms={"bad": {"rl.nope": 1}}))
    args = ["--config", write_config(tmp_path, config), "--artifacts-root", str(tmp_path)]
    assert experiment_main([*args, "--run-name", "exp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "arm 'bad'" in err[0]
    assert not (tmp_path / "exp").exists()


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("experiment.iterations=0", "experiment.iterations"),
        ("experiment.evaluation_split=train", "evaluation_split"),
        ("experiment.arms=1", "not a settable field"),
    ],
)
def test_bad_experiment_settings_fail_with_one_line(tmp_path, capsys, override, needle):
    args = ["--config", write_config(tmp_path, CONFIG), "--artifacts-root", str(tmp_path)]
    assert experiment_main([*args, "--set", override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
    assert not (tmp_path / "experiment").exists()


def test_sigkill_mid_arm_then_rerun_matches_an_uninterrupted_experiment(prefect_harness, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    config = write_config(tmp_path, CONFIG)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    args = ["--config", config, "--run-name", "exp", "--no-wandb"]
    assert experiment_main([*args, "--artifacts-root", str(whole)]) == 0

    command = [sys.executable, "-m", "flows.experiment", *args, "--artifacts-root", str(killed)]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.Popen(  # its own process group: the kill takes Prefect's server too
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    marker = killed / "exp" / "arms" / "malt" / "iterations" / "0000" / "nodes.parquet"
    deadline = time.monotonic() + 120
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "exp" / "summary.parquet").exists()  # killed mid-arm
    assert experiment_main([*args, "--artifacts-root", str(killed)]) == 0

    columns = list(EXPERIMENT_COLUMNS)
    expected = pd.read_parquet(whole / "exp" / "experiment.parquet")[columns]
    assert pd.read_parquet(killed / "exp" / "experiment.parquet")[columns].equals(expected)
    for relative in ("arms/malt/iterations/0001/eval.parquet", "base/iterations/0000/eval.parquet"):
        assert (killed / "exp" / relative).read_bytes() == (whole / "exp" / relative).read_bytes()
