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
    "text_rl.test_scheme=all",  # an evaluation too: its shards are tasks as well
    "text_rl.test_on_whole_dataset=false",
]


def nodes(root, run: str, name: str = "nodes.parquet") -> pd.DataFrame:
    frame = pd.read_parquet(root / run / "iterations" / "0000" / name)
    return frame.sort_values("node_id").reset_index(drop=True)


def same_trees(root, run: str) -> None:
    pd.testing.assert_frame_equal(nodes(root, "default"), nodes(root, run))
    pd.testing.assert_frame_equal(
        nodes(root, "default", "eval-nodes.parquet"), nodes(root, run, "eval-nodes.parquet")
    )


def run(root, name: str, **runner) -> None:
    malt_iteration(
        overrides=SMALL, run_name=name, artifacts_root=str(root), use_wandb=False, **runner
    )


@pytest.mark.skipif(importlib.util.find_spec("prefect_dask") is None, reason="no prefect-dask")
def test_dask_cluster_of_two_worker_processes_grows_the_same_trees(prefect_harness, tmp_path):
    run(tmp_path, "default")
    run(tmp_path, "dask", task_runner="dask")
    same_trees(tmp_path, "dask")
    shards = tmp_path / "dask" / "iterations" / "0000"
    assert len(list(shards.glob("calls-shard-*.jsonl"))) == 3  # one journal per shard task
    assert len(list(shards.glob("eval-shards/nodes-*.parquet"))) >= 2


def test_ray_task_runner(prefect_harness, tmp_path):
    if importlib.util.find_spec("prefect_ray") is None:
        pytest.skip("prefect-ray is not installed (optional extra `.[ray]`: ray's wheel is large)")
    run(tmp_path, "default")
    run(tmp_path, "ray", task_runner="ray")
    same_trees(tmp_path, "ray")
