"""End-to-end iterations with the dummy backend: artifacts, resume after SIGKILL, bad config.

pytest tests/test_flow_iteration.py
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from flows.malt_iteration import malt_iteration
from nip_core.agents.call_journal import read_journal
from tests.resume_checks import assert_only_unjournaled_calls_repeat

REPO = Path(__file__).resolve().parent.parent
NODE_COLUMNS = {
    "datapoint_id",
    "node_id",
    "parent_id",
    "round",
    "messages",
    "decision",
    "y",
    "ended",
    "failure",
}
REWARD_COLUMNS = {
    "node_id",
    "agent",
    "active",
    "reward",
    "expected_reward",
    "threshold",
    "is_positive",
}
PAIR_COLUMNS = {
    "agent",
    "parent_node_id",
    "chosen_node_id",
    "rejected_node_id",
    "chosen_expected_reward",
    "rejected_expected_reward",
    "method",
}
DPO_COLUMNS = {
    "prompt",
    "chosen",
    "rejected",
    "iteration",
    "agent",
    "datapoint_id",
    "parent_node_id",
    "chosen_node_id",
    "rejected_node_id",
    "chosen_expected_reward",
    "rejected_expected_reward",
}

DUMMY = "agents._default.use_dummy_api=true"
SMALL = [
    DUMMY,
    "rl.rollouts_per_iteration=6",
    "text_rl.rollout_shard_size=2",
    "nip_protocol.max_message_rounds=4",
    "debate_protocol.max_message_rounds=4",
]


def iteration_dir(root: Path, run: str, iteration: int = 0) -> Path:
    return root / run / "iterations" / f"{iteration:04d}"


@pytest.mark.parametrize("protocol", ["nip", "debate", "solo_verifier"])
def test_iteration_writes_documented_artifacts(prefect_harness, tmp_path, protocol):
    overrides = [f"interaction_protocol={protocol}", *SMALL]
    stats = malt_iteration(overrides=overrides, run_name=protocol, artifacts_root=str(tmp_path))
    it = iteration_dir(tmp_path, protocol)
    nodes = pd.read_parquet(it / "nodes.parquet")
    rewards = pd.read_parquet(it / "rewards.parquet")
    pairs = pd.read_parquet(it / "pairs.parquet")
    assert NODE_COLUMNS <= set(nodes.columns)
    assert REWARD_COLUMNS <= set(rewards.columns)
    assert PAIR_COLUMNS <= set(pairs.columns)
    assert nodes["parent_id"].isna().sum() == 6  # one root per datapoint
    assert len(rewards) == len(nodes) * rewards["agent"].nunique()
    # Every pair is two siblings under the recorded parent, chosen at least as good.
    parent_of = dict(zip(nodes["node_id"], nodes["parent_id"], strict=True))
    for pair in pairs.itertuples():
        assert parent_of[pair.chosen_node_id] == pair.parent_node_id
        assert parent_of[pair.rejected_node_id] == pair.parent_node_id
        assert pair.chosen_expected_reward > pair.rejected_expected_reward
    manifest = json.loads((it / "manifest.json").read_text())
    for stage in [
        "batch",
        "rollouts",
        "rewards",
        "pairs",
        "export",
        "summary",
        "fine_tune",
        "switch_model",
    ]:
        assert stage in manifest["stages"], stage
    assert manifest["stats"]["nodes"] == len(nodes)
    assert stats["verifier"]["accuracy"] == manifest["stats"]["verifier"]["accuracy"]
    groups = {p.name for p in (it / "datasets" / "dpo").glob("*.parquet")}
    assert groups == {f"{agent}.parquet" for agent in set(rewards["agent"])}
    for path in (it / "datasets" / "dpo").glob("*.parquet"):
        dpo = pd.read_parquet(path)
        assert DPO_COLUMNS <= set(dpo.columns)
        jsonl = [json.loads(line) for line in path.with_suffix(".jsonl").read_text().splitlines()]
        assert len(jsonl) == len(dpo)
        for row, line in zip(dpo.itertuples(), jsonl, strict=True):
            assert row.prompt[0]["role"] == "system"
            assert line["preferred_output"][0]["content"] == row.chosen[0]["content"]
            assert set(line) == {"input", "preferred_output", "non_preferred_output"}


def test_rerun_of_a_finished_iteration_calls_no_model(prefect_harness, tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    monkeypatch.setenv("NIP_DUMMY_CALL_LOG", str(log))
    malt_iteration(overrides=SMALL, run_name="r", artifacts_root=str(tmp_path / "a"))
    calls = log.read_text().splitlines()
    assert calls
    malt_iteration(overrides=SMALL, run_name="r", artifacts_root=str(tmp_path / "a"))
    assert log.read_text().splitlines() == calls


def test_corrupted_artifact_is_recomputed_with_a_warning(prefect_harness, tmp_path, caplog):
    malt_iteration(overrides=SMALL, run_name="c", artifacts_root=str(tmp_path))
    rewards = iteration_dir(tmp_path, "c") / "rewards.parquet"
    original = rewards.read_bytes()
    rewards.write_bytes(b"garbage")
    malt_iteration(overrides=SMALL, run_name="c", artifacts_root=str(tmp_path))
    assert rewards.read_bytes() == original
    assert "rewards.parquet" in caplog.text and "checksum mismatch" in caplog.text


def run_cli(args, env, **kwargs):
    """The command in its own process group, so a kill takes Prefect's temporary server too."""
    return subprocess.Popen(
        [sys.executable, "-m", "flows.malt_iteration", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )


def journal_lines(it: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in it.glob("calls-*.jsonl"))


@pytest.mark.slow
def test_sigkill_during_generation_then_resume_matches_uninterrupted(prefect_harness, tmp_path):
    overrides = [
        DUMMY,
        "rl.rollouts_per_iteration=8",
        "text_rl.rollout_shard_size=2",
        "nip_protocol.max_message_rounds=5",
    ]
    malt_iteration(overrides=overrides, run_name="whole", artifacts_root=str(tmp_path))

    call_log = tmp_path / "calls.log"
    env = {**os.environ, "NIP_DUMMY_LATENCY": "0.3", "NIP_DUMMY_CALL_LOG": str(call_log)}
    args = [f"--set={o}" for o in overrides] + [
        "--run-name",
        "killed",
        "--artifacts-root",
        str(tmp_path),
    ]
    it = iteration_dir(tmp_path, "killed")
    process = run_cli(args, env)
    deadline = time.monotonic() + 240
    while journal_lines(it) < 12:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "generation never started"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (it / "nodes.parquet").exists()
    before = call_log.read_text().splitlines()
    journaled = set()
    for journal in it.glob("calls-*.jsonl"):
        journaled |= set(read_journal(journal))

    resumed = run_cli(args, env)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    # Only a call killed between its answer and its journal line's fsync may be made again.
    assert_only_unjournaled_calls_repeat(before, call_log.read_text().splitlines(), journaled)

    whole = iteration_dir(tmp_path, "whole")
    files = [
        "batch.parquet",
        "nodes.parquet",
        "rewards.parquet",
        "pairs.parquet",
        "datasets/dpo/prover.parquet",
        "datasets/dpo/verifier.parquet",
    ]
    for name in files:
        assert (it / name).read_bytes() == (whole / name).read_bytes(), name


def test_bad_config_is_one_line_exit_2_and_writes_nothing(tmp_path):
    env = {**os.environ}
    for bad in [
        "--set=nip_protocol.max_message_rounds=abc",
        "--set=no_such.key=1",
        "--set=pure_text_malt.interval_threshold_proportion=0",
    ]:
        process = run_cli([bad, "--artifacts-root", str(tmp_path / "out")], env)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 2, (bad, err)
        assert len(err.strip().splitlines()) == 1 and err.startswith("error:"), err
        assert not (tmp_path / "out").exists()


def test_help_documents_the_options():
    out = subprocess.run(
        [sys.executable, "-m", "flows.malt_iteration", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for option in ["--config", "--set", "--run-name", "--artifacts-root", "--iteration"]:
        assert option in out


def test_every_client_is_closed_inside_the_loop_that_used_it(
    prefect_harness, tmp_path, monkeypatch
):
    """Open SDK clients collected during a later stage's loop log "Event loop is closed"."""
    import asyncio

    from nip_core.agents.clients import DummyChatClient
    from nip_core.training.model_groups import SharedModelGroup

    closed: list[tuple[str, str]] = []

    async def close_chat(self):
        asyncio.get_running_loop()  # raises outside a running loop
        closed.append(("chat", "client"))

    async def close_group(self):
        asyncio.get_running_loop()
        closed.append(("group", self.name))

    monkeypatch.setattr(DummyChatClient, "aclose", close_chat, raising=False)
    monkeypatch.setattr(SharedModelGroup, "aclose", close_group)
    overrides = [*SMALL, "text_rl.test_scheme=all", "text_rl.test_on_whole_dataset=false"]
    malt_iteration(overrides=overrides, run_name="close", artifacts_root=str(tmp_path))
    assert closed.count(("chat", "client")) >= 2  # rollouts, then the test stage
    for group in ("verifier", "prover"):
        assert closed.count(("group", group)) == 2  # fine-tune, then switch
