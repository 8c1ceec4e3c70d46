"""The verifier's P(accept) per evaluated episode, scored by a real server (dummy engine)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml

from flows.experiment import main as experiment_main
from nip_core.malt.verdict_scores import accept_probability
from tests.conftest_lm import running_server


def test_accept_probability_is_the_softmax_of_the_two_verdicts():
    assert accept_probability(-1.0, -1.0) == 0.5
    assert accept_probability(math.log(0.75), math.log(0.25)) == pytest.approx(0.75)
    assert accept_probability(0.0, -1e6) == 1.0 and accept_probability(-1e6, 0.0) < 1e-300


@pytest.mark.slow
def test_experiment_episodes_carry_the_scored_probability(prefect_harness, tmp_path):
    with running_server(["--engine", "dummy"], tmp_path / "state") as server:
        agent = {
            "model_provider": "SelfHosted",
            "model_name": "SmolLM2-135M-Instruct",
            "language_model_server_scheme_host": "http://127.0.0.1",
            "language_model_server_port": server.port,
        }
        config = {
            "scenario": "code_validation",
            "trainer": "pure_text_malt",
            "dataset": "humaneval-buggy",
            "interaction_protocol": "solo_verifier",
            "seed": 3,
            "agents": {"_default": agent},
            "rl": {"rollouts_per_iteration": 4},
            "dataset_options": {"max_test_size": 6},
            "pure_text_malt": {"num_responses_per_timestep": 2},
            "experiment": {"iterations": 1, "bootstrap_resamples": 50, "arms": {"malt": {}}},
        }
        path = tmp_path / "exp.yaml"
        path.write_text(yaml.safe_dump(config))
        args = ["--config", str(path), "--artifacts-root", str(tmp_path), "--run-name", "v"]
        assert experiment_main([*args, "--no-wandb"]) == 0
        base = tmp_path / "v" / "seeds" / "3" / "base" / "iterations" / "0000"
        verdicts = pd.read_parquet(base / "eval-verdicts.parquet")
        nodes = pd.read_parquet(base / "eval-nodes.parquet")
        assert len(verdicts) == len(pd.read_parquet(base / "eval.parquet")) > 0
        assert verdicts["p_accept"].between(0, 1).all()
        # the dummy engine scores a two-word reply at -2 to -4 nats: P(accept) = sigmoid of a
        # difference within [-2, 2], different per chat
        bound = 1 / (1 + math.exp(2))
        assert verdicts["p_accept"].between(bound, 1 - bound).all()
        assert verdicts["p_accept"].nunique() > 1
        assert set(verdicts["leaf_node_id"]) <= set(nodes["node_id"])
        experiment = pd.read_parquet(tmp_path / "v" / "experiment.parquet")
        base_rows = experiment[(experiment.arm == "base")]
        assert base_rows["p_accept"].notna().all()
        summary = pd.read_parquet(tmp_path / "v" / "summary.parquet")
        assert summary["auc"].between(0, 1).all()
