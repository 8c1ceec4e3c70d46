"""Seeds side by side (`experiment.parallel_seeds`): worker processes, a server each, the same
rows as one after another. Real server processes on the dummy engine."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from flows import experiment, lm_server
from flows.experiment import main as experiment_main
from flows.experiment import resolve_experiment, seeds_at_once
from nip_core.experiment.stats import EXPERIMENT_COLUMNS
from nip_core.lm_server.launch import free_port
from nip_core.parameters import HyperParameters
from nip_core.run.iteration_context import build_context
from tests.test_experiment_flow import CONFIG, write_config
from tests.test_lm_server_ownership import self_hosted

SELF_HOSTED = {
    "_default": {
        "model_provider": "SelfHosted",
        "use_dummy_api": False,
        "model_name": "SmolLM2-135M-Instruct",
        "language_model_server_scheme_host": "http://127.0.0.1",
    }
}


@pytest.fixture
def dummy_engine(monkeypatch):
    monkeypatch.setenv(lm_server.ENGINE_ENV, "dummy")  # worker processes inherit it


def _port_with_the_next_one_held():
    """A free port and a socket holding the port after it (retried: the next one may be taken by
    another test, which made this test fail by chance)."""
    import socket

    for _ in range(50):
        port = free_port()
        busy = socket.socket()
        try:
            busy.bind(("127.0.0.1", port + 1))
        except OSError:
            busy.close()
            continue
        return port, busy
    raise AssertionError("no free port with a free port after it")


def test_side_by_side_urls_skip_busy_ports(dummy_engine):
    port, busy = _port_with_the_next_one_held()
    with busy:
        busy.listen()
        urls = lm_server.side_by_side_urls(self_hosted(port), 3)
    assert urls[0] == f"http://127.0.0.1:{port}"
    assert f"http://127.0.0.1:{port + 1}" not in urls and len(set(urls)) == 3


def test_side_by_side_urls_leave_other_servers_alone(dummy_engine):
    dummy_api = build_context(HyperParameters.construct_test_params(), "r", 0)
    assert lm_server.side_by_side_urls(dummy_api, 2) == [None, None]
    shared = self_hosted(free_port(), "server.shared=true")
    assert lm_server.side_by_side_urls(shared, 2) == [None, None]
    remote = self_hosted(7, "agents._default.language_model_server_scheme_host=http://10.0.0.7")
    assert lm_server.side_by_side_urls(remote, 2) == [None, None]  # the user's own server


def test_vllm_servers_side_by_side_are_refused_with_the_way_out(monkeypatch):
    monkeypatch.setenv(lm_server.ENGINE_ENV, "vllm")
    with pytest.raises(ValueError, match="parallel_seeds: 1"):
        lm_server.side_by_side_urls(self_hosted(free_port()), 2)


def test_vllm_side_by_side_fails_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(lm_server.ENGINE_ENV, "vllm")
    config = write_config(tmp_path, dict(CONFIG, agents=SELF_HOSTED))
    args = ["--config", config, "--artifacts-root", str(tmp_path), "--no-wandb"]
    assert experiment_main([*args, "--set", "experiment.parallel_seeds=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "parallel_seeds: 1" in err[0]
    assert not (tmp_path / "experiment").exists()


def test_seeds_at_once_follows_the_setting_then_the_machine(tmp_path, monkeypatch):
    config = write_config(tmp_path, dict(CONFIG, agents=SELF_HOSTED))
    monkeypatch.setenv(lm_server.ENGINE_ENV, "transformers")
    spec = resolve_experiment(config, ["experiment.parallel_seeds=3"])
    assert [seeds_at_once(spec, n) for n in (0, 1, 2, 5)] == [1, 1, 2, 3]
    auto = resolve_experiment(config, [])
    monkeypatch.setattr(experiment, "has_cuda", lambda: True)
    assert seeds_at_once(auto, 6) == experiment.AUTO_PARALLEL_SEEDS
    monkeypatch.setenv(lm_server.ENGINE_ENV, "vllm")  # a vLLM server claims the GPU for itself
    assert seeds_at_once(auto, 6) == 1
    monkeypatch.setattr(experiment, "has_cuda", lambda: False)
    monkeypatch.setenv(lm_server.ENGINE_ENV, "transformers")
    assert seeds_at_once(auto, 6) == 1


def lifetime(seed_folder: Path) -> tuple[float, float]:
    """When the seed's first file (its base run's configuration) and last (its timings) were
    written."""
    first = seed_folder / "base" / "hyper_params.json"
    return first.stat().st_mtime, (seed_folder / "timings.parquet").stat().st_mtime


def overlap(folder: Path, seeds: tuple[int, int] = (11, 5)) -> bool:
    """Whether the two seeds of the experiment in `folder` ran at the same time."""
    (start_a, end_a), (start_b, end_b) = (lifetime(folder / "seeds" / str(s)) for s in seeds)
    return start_a < end_b and start_b < end_a


@pytest.mark.slow
def test_two_seeds_side_by_side_match_one_after_another(prefect_harness, tmp_path, dummy_engine):
    config = dict(
        CONFIG,
        agents={"_default": dict(SELF_HOSTED["_default"], language_model_server_port=free_port())},
        experiment=dict(CONFIG["experiment"], iterations=1, arms={"malt": {}}),
    )
    args = ["--config", write_config(tmp_path, config), "--no-wandb"]
    args += ["--set", "experiment.seeds=[11, 5]", "--run-name", "exp"]
    together, apart = tmp_path / "together", tmp_path / "apart"
    side_by_side = ["--set", "experiment.parallel_seeds=2", "--artifacts-root", str(together)]
    assert experiment_main([*args, *side_by_side]) == 0
    assert (
        experiment_main(
            [*args, "--set", "experiment.parallel_seeds=1", "--artifacts-root", str(apart)]
        )
        == 0
    )

    # the dummy engine scores by model name, and a fine-tuned model's holds its job's id:
    # P(accept) is compared for the base model only
    columns = [c for c in EXPERIMENT_COLUMNS if c != "p_accept"]
    rows, again = (pd.read_parquet(f / "exp" / "experiment.parquet") for f in (together, apart))
    assert rows[columns].equals(again[columns])
    base = rows["arm"] == "base"
    assert rows.loc[base, "p_accept"].equals(again.loc[base, "p_accept"])
    assert sorted(rows["seed"].unique()) == [5, 11]
    assert overlap(together / "exp"), "side by side, the seeds ran at the same time"
    assert not overlap(apart / "exp")
