"""Where we follow the seeds after all: `load_from_wandb_config`, version checks when a stored
run is read, and `server.vllm_port` (nip's per-agent `vllm_server_port`) as the port of the vLLM
server."""

from __future__ import annotations

import json
import subprocess

import pytest

from flows import lm_server
from nip_core.parameters import HyperParameters, PureTextAgentParameters
from nip_core.parameters.loading import apply_overrides
from nip_core.report import read_run
from nip_core.report.run_reader import RunReadError
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_context import build_context


def test_load_from_wandb_config_returns_an_updated_agent_ignoring_nip_checkpoint_fields():
    agent = PureTextAgentParameters(model_name="a")
    stored = PureTextAgentParameters(model_name="b", temperature=0.3).to_dict()
    loaded = agent.load_from_wandb_config({**stored, "_type": "Whatever", "checkpoint_run_id": "x"})
    assert loaded.model_name == "b" and loaded.temperature == 0.3
    assert agent.model_name == "a"  # frozen: the original is unchanged
    with pytest.raises(ValueError, match="is_random"):
        agent.load_from_wandb_config({"is_random": True})
    with pytest.raises(ValueError):
        agent.load_from_wandb_config({"temperature": -1.0})  # validated like any agent


def test_reading_a_run_checks_the_stored_parameter_version(tmp_path):
    paths = RunPaths.open(str(tmp_path), "old")
    stored = HyperParameters.construct_test_params().to_dict(include_package_meta=True)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "hyper_params.json").write_text(json.dumps(stored))
    assert read_run(paths.run_dir).hyper_params["seed"] == stored["seed"]
    stored["_package_version"] = "99.0.0"
    (tmp_path / "old" / "hyper_params.json").write_text(json.dumps(stored))
    with pytest.raises(RunReadError, match="newer"):
        _ = read_run(paths.run_dir).hyper_params


def test_the_vllm_engine_gets_the_servers_vllm_port(tmp_path, monkeypatch):
    hp = apply_overrides(
        HyperParameters.construct_test_params(),
        [
            "agents._default.model_provider=SelfHosted",
            "agents._default.use_dummy_api=false",
            "agents._default.language_model_server_port=5999",
            "server.vllm_port=8123",
        ],
    )
    commands = []

    def fake_popen(command, **_):
        commands.append(command)
        raise OSError("not starting anything in a test")

    monkeypatch.setenv(lm_server.ENGINE_ENV, "vllm")
    monkeypatch.setattr(lm_server, "server_identity", lambda url: None)
    monkeypatch.setattr(lm_server, "port_is_free", lambda host, port: True)
    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    context = build_context(hp, "r", 0)
    with pytest.raises(OSError):
        lm_server.ensure_lm_server(RunPaths.open(str(tmp_path), "r"), context)
    (command,) = commands
    assert command[command.index("--vllm-port") + 1] == "8123"
    assert command[command.index("--port") + 1] == "5999"


def test_gpu_settings_reach_the_vllm_and_training_command_lines(tmp_path, monkeypatch):
    """Config -> our server's flags -> `vllm serve` and `accelerate launch` argv (unit level:
    no GPU here)."""
    from pathlib import Path as P

    from nip_core.lm_server.__main__ import _parse, vllm_options
    from nip_core.lm_server.engines.vllm.config import VllmServeConfig, vllm_command
    from nip_core.lm_server.procs import training_command

    hp = apply_overrides(
        HyperParameters.construct_test_params(),
        [
            "agents._default.model_provider=SelfHosted",
            "agents._default.use_dummy_api=false",
            "server.vllm_tensor_parallel_size=4",
            "server.vllm_data_parallel_size=2",
            "server.vllm_gpu_memory_utilization=0.7",
            "server.vllm_max_model_len=8192",
            "server.vllm_enforce_eager=true",
            "server.vllm_serve_during_training=true",
            "agents._default.lora_rank=32",
            "server.training_num_processes=8",
            "server.training_deepspeed_config=zero2.json",
        ],
    )
    flags = lm_server.server_options(build_context(hp, "r", 0), "vllm")
    server_args = _parse(["--engine", "vllm", *flags])
    argv = vllm_command(VllmServeConfig(model="m", **vllm_options(server_args)))
    pairs = dict(zip(argv, argv[1:], strict=False))
    assert pairs["--tensor-parallel-size"] == "4" and pairs["--data-parallel-size"] == "2"
    assert pairs["--gpu-memory-utilization"] == "0.7" and pairs["--max-model-len"] == "8192"
    assert pairs["--max-lora-rank"] == "32" and pairs["--port"] == "8000"
    assert "--enforce-eager" in argv
    assert server_args.vllm_serve_during_training
    command = training_command(
        P("/jobs/j1"), server_args.train_processes, server_args.train_deepspeed_config
    )
    assert command[1:3] == ["-m", "accelerate.commands.launch"]
    assert command[command.index("--num_processes") + 1] == "8" and "--multi_gpu" in command
    assert command[command.index("--deepspeed_config_file") + 1] == "zero2.json"
    assert command[-3:] == ["-m", "nip_core.lm_server.train_job", "/jobs/j1"]
    # One GPU (the default): the plain child, as before.
    assert training_command(P("/jobs/j1"))[1:] == ["-m", "nip_core.lm_server.train_job", "/jobs/j1"]
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        VllmServeConfig(model="m", tensor_parallel_size=0)


def test_the_server_engine_comes_from_the_config_and_the_environment_wins(monkeypatch):
    def engine(*overrides: str) -> str:
        hp = apply_overrides(
            HyperParameters.construct_test_params(),
            [
                "agents._default.model_provider=SelfHosted",
                "agents._default.use_dummy_api=false",  # the dummy API is served by no server
                *overrides,
            ],
        )
        return lm_server.server_engine(build_context(hp, "r", 0))

    monkeypatch.delenv(lm_server.ENGINE_ENV, raising=False)
    assert engine() == "transformers"
    assert engine("server.engine=vllm") == "vllm"
    monkeypatch.setenv(lm_server.ENGINE_ENV, "dummy")
    assert engine("server.engine=vllm") == "dummy"
    with pytest.raises(ValueError, match="engine"):
        engine("server.engine=tgi")
