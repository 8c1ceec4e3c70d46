"""`flows.experiment` end to end on the dummy backend: files, columns, resume, bad arms."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flows.experiment import main as experiment_main
from nip_core.experiment.reference import REFERENCE_ARMS
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
    """`malt_all_pairs` stops after one of the experiment's two iterations (`rl.num_iterations`)."""
    arms = {
        "malt": {},
        "malt_all_pairs": {"pure_text_malt.pairs_per_parent": "all", "rl.num_iterations": 1},
    }
    config = dict(CONFIG, experiment=dict(CONFIG["experiment"], arms=arms))
    args = ["--config", write_config(tmp_path, config), "--artifacts-root", str(tmp_path)]
    assert experiment_main([*args, "--run-name", "exp", "--no-wandb"]) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "exp"
    for name in ("experiment.parquet", "summary.parquet", "experiment.html", "experiment.png"):
        assert (folder / name).stat().st_size > 0, name
    assert (folder / "training.parquet").exists()  # empty: dummy jobs report no steps
    seed = folder / "seeds" / "11"
    assert (seed / "arms" / "malt" / "iterations" / "0001" / "eval.parquet").exists()
    assert (seed / "base" / "iterations" / "0000" / "eval.parquet").exists()
    assert (seed / "rows.parquet").exists() and (seed / "timings.parquet").exists()
    experiment = pd.read_parquet(folder / "experiment.parquet")
    summary = pd.read_parquet(folder / "summary.parquet")
    assert list(experiment.columns) == list(EXPERIMENT_COLUMNS)
    assert list(summary.columns[: len(SUMMARY_COLUMNS)]) == list(SUMMARY_COLUMNS)
    # 10 test datapoints x 2 samples per (arm, iteration): base, 3 reference arms, 2 + 1 trained
    assert len(experiment) == 20 * 7
    assert set(experiment["sample"]) == {0, 1} and set(experiment["seed"]) == {11}
    assert not (seed / "arms" / "malt_all_pairs" / "iterations" / "0002").exists()
    references = [[arm, 0] for arm in REFERENCE_ARMS]
    trained = [["malt", it] for it in (0, 1, 2)] + [["malt_all_pairs", it] for it in (0, 1)]
    assert summary[["arm", "iteration"]].values.tolist() == (references + trained) * 2
    assert summary["scope"].tolist() == ["seed"] * 8 + ["across_seeds"] * 8
    for row in summary[summary.scope == "seed"].itertuples():
        arm = "base" if row.iteration == 0 and row.arm not in REFERENCE_ARMS else row.arm
        rows = experiment[(experiment.arm == arm) & (experiment.iteration == row.iteration)]
        assert row.accuracy == pytest.approx(rows["correct"].mean())
        assert row.decision_rate == pytest.approx(rows["decided"].mean())
    trained = summary[summary.iteration > 0]
    assert (trained.train_model_calls == 6 * 2).all()  # datapoints x K, one turn each
    assert (trained.wall_seconds >= 0).all()
    always = summary[summary.arm == "always_accept"].iloc[0]
    assert (always.accept_rate, always.auc, always.accept_rate_flagged) == (1.0, 0.5, True)
    assert "malt_all_pairs" in out and "acc|dec - base" in out

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
        ("experiment.arms=1", "experiment.arms must be a non-empty mapping"),
        ("experiment.arms.nope=null", "no arm 'nope'"),
        ("experiment.arms.malt=1", "experiment.arms.malt must be a mapping"),
        ("experiment.nope=1", "not a settable field"),
        ("experiment.parallel_seeds=0", "experiment.parallel_seeds"),
        ("experiment.arms.malt={rl.num_iterations: 3}", "an arm may run fewer, not more"),
        ("experiment.arms.later={starts_from: nope}", "'nope' is not an arm listed before"),
        ("experiment.arms.malt={starts_from: malt}", "'malt' is not an arm listed before"),
        ("experiment.arms.shuffled_labels_hot={rl.num_iterations: 1}", "trains on the true labels"),
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
    marker = killed / "exp" / "seeds" / "11" / "arms" / "malt" / "iterations" / "0000"
    marker = marker / "nodes.parquet"
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
    for relative in (
        "seeds/11/arms/malt/iterations/0001/eval.parquet",
        "seeds/11/base/iterations/0000/eval.parquet",
    ):
        assert (killed / "exp" / relative).read_bytes() == (whole / "exp" / relative).read_bytes()


def test_seeds_run_every_arm_and_a_rerun_skips_finished_seeds(prefect_harness, tmp_path):
    config = dict(
        CONFIG,
        text_rl={"verifier_guess_replacement_proportion": 1.0},
        pure_text_malt=dict(
            CONFIG.get("pure_text_malt", {}), verifier_training_signal="label_pairs"
        ),
        experiment=dict(
            CONFIG["experiment"],
            iterations=1,
            arms={"shuffled_label_pairs": {"text_rl.shuffle_training_labels": True}},
        ),
    )
    args = ["--config", write_config(tmp_path, config), "--artifacts-root", str(tmp_path)]
    args += ["--run-name", "seeds", "--no-wandb", "--set", "experiment.seeds=[11, 5]"]
    assert experiment_main(args) == 0
    folder = tmp_path / "seeds"
    experiment = pd.read_parquet(folder / "experiment.parquet")
    summary = pd.read_parquet(folder / "summary.parquet")
    assert sorted(experiment["seed"].unique()) == [5, 11]
    per_seed = summary[summary.scope == "seed"]
    assert sorted(per_seed["seed"].unique()) == [5, 11]
    across = summary[(summary.scope == "across_seeds") & (summary.arm == "shuffled_label_pairs")]
    assert across["seeds"].tolist() == [2, 2] and across["seed"].isna().all()
    # the control arm trained on permuted labels: its DPO label pairs disagree with the truth
    export = folder / "seeds" / "5" / "arms" / "shuffled_label_pairs" / "iterations" / "0000"
    pairs = pd.read_parquet(export / "datasets" / "dpo" / "verifier.parquet")
    pairs = pairs[pairs["guess_replaced"]]
    truth = load_split_labels(5)
    chosen_accept = pairs["chosen"].map(lambda m: m[0]["content"].endswith("accept"))
    agree = (chosen_accept.astype(int) == pairs["datapoint_id"].map(truth)).mean()
    assert agree < 0.9

    before = digests(folder)
    assert experiment_main(args) == 0
    assert digests(folder) == before  # both seeds reused whole
    check_combined_summary(folder, summary, tmp_path / "combined")


def check_combined_summary(folder: Path, summary: pd.DataFrame, out: Path) -> None:
    """scripts/combine_experiments.py on the experiment's own seeds gives its summary, and
    again from the result folder it wrote (timings included); a seed that two folders hold is
    refused."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    script = repo / "scripts" / "combine_experiments.py"

    def run(*folders: Path, into: Path = out) -> subprocess.CompletedProcess:
        command = [sys.executable, str(script), "--out", str(into), "--resamples", "100"]
        env = {**os.environ, "PYTHONPATH": str(repo)}
        return subprocess.run(
            [*command, *map(str, folders)], capture_output=True, text=True, env=env
        )

    done = run(folder)
    assert done.returncode == 0, done.stderr
    combined = pd.read_parquet(out / "summary.parquet")
    keys, estimates = ["scope", "seed", "arm", "iteration"], ["accuracy_when_decided", "auc"]
    columns = [*keys, *estimates, "decision_rate", "accept_rate"]
    expected = summary[columns].sort_values(keys, na_position="first").reset_index(drop=True)
    got = combined[columns].sort_values(keys, na_position="first").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected)  # the point estimates; CIs are resampled
    twice = run(folder, folder)
    assert twice.returncode == 2 and "seed 5 is in more than one" in twice.stderr

    published = out.parent / f"{out.name}-again"
    again = run(out, into=published)  # the result folder as the input
    assert again.returncode == 0, again.stderr
    republished = pd.read_parquet(published / "summary.parquet")
    columns += ["wall_seconds", "train_model_calls"]
    for frame in (combined, republished):
        frame.sort_values(keys, na_position="first", inplace=True, ignore_index=True)
    pd.testing.assert_frame_equal(republished[columns], combined[columns])
    assert run(folder, out).returncode == 2  # the same seeds, published and not


def load_split_labels(seed: int) -> dict[int, int]:
    from nip_core.data.splits import load_split
    from nip_core.experiment.config import split_config
    from nip_core.parameters import HyperParameters

    data, _ = split_config(dict(CONFIG, seed=seed))
    frame = load_split(HyperParameters.from_dict(data), "train")
    return dict(zip(frame["id"].astype(int), frame["y"].astype(int), strict=True))


def test_a_finished_experiment_extends_by_more_iterations(prefect_harness, tmp_path):
    """`experiment.iterations` 1 -> 2 on a finished experiment trains only the new iteration;
    the first keeps its files."""
    config = dict(CONFIG, experiment=dict(CONFIG["experiment"], iterations=1, arms={"malt": {}}))
    args = ["--config", write_config(tmp_path, config), "--artifacts-root", str(tmp_path)]
    args += ["--run-name", "ext", "--no-wandb"]
    assert experiment_main(args) == 0
    arm = tmp_path / "ext" / "seeds" / "11" / "arms" / "malt"
    first = digests(arm / "iterations" / "0000")
    assert experiment_main([*args, "--set", "experiment.iterations=2"]) == 0
    assert digests(arm / "iterations" / "0000") == first
    assert (arm / "iterations" / "0001" / "datasets" / "dpo" / "verifier.parquet").exists()
    rows = pd.read_parquet(tmp_path / "ext" / "experiment.parquet")
    assert sorted(rows.loc[rows.arm == "malt", "iteration"].unique()) == [1, 2]
    stored = json.loads((arm / "hyper_params.json").read_text())
    assert stored["rl"]["num_iterations"] == 2


def test_an_arm_starts_from_the_models_an_earlier_arm_ended_with(prefect_harness, tmp_path):
    """Rung (e)'s set-up: the nip protocol's verifier starts from the solo arm's last verifier
    (the prover from the configured model), and the arm is evaluated before it trains."""
    nip = {
        "starts_from": "malt",
        "interaction_protocol": "nip",
        "nip_protocol.max_message_rounds": 3,
        "nip_protocol.min_message_rounds": 3,
        "rl.num_iterations": 1,
    }
    solo = {"rl.rollouts_per_iteration": 24, "pure_text_malt.num_responses_per_timestep": 4}
    arms = {"malt": solo, "nip": nip}  # enough pairs that the solo verifier trains
    config = dict(CONFIG, experiment=dict(CONFIG["experiment"], arms=arms))
    args = ["--config", write_config(tmp_path, config), "--artifacts-root", str(tmp_path)]
    assert experiment_main([*args, "--run-name", "start", "--no-wandb"]) == 0
    seed = tmp_path / "start" / "seeds" / "11" / "arms"
    last = json.loads((seed / "malt" / "iterations" / "0001" / "manifest.json").read_text())
    trained_verifier = last["models_after"]["verifier"]
    configured = json.loads((seed / "malt" / "hyper_params.json").read_text())["agents"]
    assert trained_verifier != configured["_default"]["model_name"]
    stored = json.loads((seed / "nip" / "hyper_params.json").read_text())
    assert stored["agents"]["verifier"]["model_name"] == trained_verifier
    assert "prover" not in stored["agents"]  # the prover starts from the configured model
    assert (seed / "nip" / "iterations" / "0000" / "eval.parquet").exists()
    rows = pd.read_parquet(tmp_path / "start" / "experiment.parquet")
    assert sorted(rows.loc[rows.arm == "nip", "iteration"].unique()) == [0, 1]
    summary = pd.read_parquet(tmp_path / "start" / "summary.parquet")
    nip_rows = summary[(summary.arm == "nip") & (summary.scope == "seed")]
    start_rows = rows[(rows.arm == "nip") & (rows.iteration == 0)]
    assert nip_rows.iloc[0].decision_rate == pytest.approx(start_rows["decided"].mean())


def test_arms_that_sample_alike_draw_their_first_rollouts_once(prefect_harness, tmp_path):
    """The control replays `malt`'s first rollout calls (same agents, same keys): the same trees,
    nothing asked again; an arm whose agents sample otherwise asks its own, and no later
    iteration replays another arm's calls (its models are its own; the dummy backend's
    fine-tuned names are not, which a replay would not show)."""
    arms = {"malt": {}, "shuffled_labels": {}, "cooler": {"agents._default.temperature": 0.5}}
    config = dict(CONFIG, experiment=dict(CONFIG["experiment"], arms=arms))
    args = ["--config", write_config(tmp_path, config), "--artifacts-root", str(tmp_path)]
    assert experiment_main([*args, "--run-name", "alike", "--no-wandb"]) == 0
    arms_dir = tmp_path / "alike" / "seeds" / "11" / "arms"

    def rollouts(arm: str, iteration: int) -> tuple[dict, pd.DataFrame, int]:
        folder = arms_dir / arm / "iterations" / f"{iteration:04d}"
        info = json.loads((folder / "manifest.json").read_text())["stages"]["rollouts"]["info"]
        journal = sum(len(p.read_text().splitlines()) for p in folder.glob("calls-*.jsonl"))
        return info, pd.read_parquet(folder / "nodes.parquet"), journal

    malt, malt_nodes, malt_calls = rollouts("malt", 0)
    control, control_nodes, control_calls = rollouts("shuffled_labels", 0)
    assert malt["replayed_calls"] == 0 and malt_calls > 0
    assert control["replayed_calls"] == malt_calls and control_calls == 0
    replies = [str(list(m)) for m in malt_nodes["raw_messages"]]
    assert [str(list(m)) for m in control_nodes["raw_messages"]] == replies
    assert (control_nodes["y"] != malt_nodes["y"]).any(), "the control's labels are shuffled"
    cooler, _, cooler_calls = rollouts("cooler", 0)
    assert cooler["replayed_calls"] == 0 and cooler_calls == malt_calls
    for arm in arms:
        assert rollouts(arm, 1)[0]["replayed_calls"] == 0


def test_the_controls_pairs_agree_with_the_truth_as_often_as_they_disagree(
    prefect_harness, tmp_path
):
    """With pairs balanced by label, the shuffled-label control's verifier pairs fall as many
    into each (shown label, true label) cell: the labels it trains on carry nothing of the
    truth. The truth is read from `malt`, which samples the same trees on unshuffled labels."""
    config = dict(
        CONFIG,
        rl={"rollouts_per_iteration": 24},
        pure_text_malt={"num_responses_per_timestep": 4, "balance_verifier_by_label": True},
        experiment=dict(
            CONFIG["experiment"], iterations=1, arms={"malt": {}, "shuffled_labels": {}}
        ),
    )
    args = ["--config", write_config(tmp_path, config), "--artifacts-root", str(tmp_path)]
    assert experiment_main([*args, "--run-name", "cells", "--no-wandb"]) == 0
    arms = tmp_path / "cells" / "seeds" / "11" / "arms"
    truth = pd.read_parquet(arms / "malt" / "iterations" / "0000" / "nodes.parquet")
    control = arms / "shuffled_labels" / "iterations" / "0000"
    shown = pd.read_parquet(control / "nodes.parquet")
    assert (shown["node_id"] == truth["node_id"]).all()
    assert (shown["y"] != truth["y"]).any(), "the control's labels are shuffled"
    pairs = pd.read_parquet(control / "pairs.parquet")
    parents = pairs.loc[pairs.agent == "verifier", "parent_node_id"]
    cells = parents.map(dict(zip(shown.node_id, zip(shown.y, truth.y, strict=True), strict=True)))
    counts = cells.value_counts()
    assert len(counts) == 4 and counts.nunique() == 1, counts.to_dict()
