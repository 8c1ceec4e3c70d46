"""Rollout shards on a distributed Prefect task runner give the same trees as the default."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest

from flows.malt_iteration import malt_iteration

SMALL = [
    "agents._default.use_dummy_api=true",
    "rl.rollouts_per_iteration=6",
    "text_rl.rollout_shard_size=2",
    "nip_protocol.max_message_rounds=3",
]


def nodes(root, run: str) -> pd.DataFrame:
    frame = pd.read_parquet(root / run / "iterations" / "0000" / "nodes.parquet")
    return frame.sort_values("node_id").reset_index(drop=True)


def run(root, name: str, **runner) -> None:
    malt_iteration(
        overrides=SMALL, run_name=name, artifacts_root=str(root), use_wandb=False, **runner
    )


@pytest.mark.skipif(importlib.util.find_spec("prefect_dask") is None, reason="no prefect-dask")
def test_dask_cluster_of_two_worker_processes_grows_the_same_trees(prefect_harness, tmp_path):
    run(tmp_path, "default")
    run(tmp_path, "dask", task_runner="dask")
    pd.testing.assert_frame_equal(nodes(tmp_path, "default"), nodes(tmp_path, "dask"))
    shards = tmp_path / "dask" / "iterations" / "0000"
    assert len(list(shards.glob("calls-shard-*.jsonl"))) == 3  # one journal per shard task


def test_ray_task_runner(prefect_harness, tmp_path):
    if importlib.util.find_spec("prefect_ray") is None:
        pytest.skip("prefect-ray is not installed (optional extra `.[ray]`: ray's wheel is large)")
    run(tmp_path, "default")
    run(tmp_path, "ray", task_runner="ray")
    pd.testing.assert_frame_equal(nodes(tmp_path, "default"), nodes(tmp_path, "ray"))
