"""Start the self-hosted language-model server when a run needs it and nothing answers.

Which agents are self-hosted, on which port, with which engine and flags is read here from the
run's agent settings; `nip_core.lm_server.launch` starts the process. The server's state goes
under the run folder (`<run>/lm_server/`). A flow stops only a server it started itself.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

from nip_core.agents.clients import provider_of
from nip_core.lm_server.launch import ServerHandle, is_up, start_server
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import LM_SERVER_DIR

ENGINE_ENV = "NIP_LM_SERVER_ENGINE"  # transformers | vllm | dummy; beats the config key
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def self_hosted_agents(context: IterationContext) -> list:
    """The settings of the agents served by our server (the dummy API aside)."""
    return [
        params
        for params in context.agent_params.values()
        if provider_of(params).self_hosted and not params.use_dummy_api
    ]


def self_hosted_endpoint(context: IterationContext) -> tuple[str, str, int] | None:
    """(scheme://host, host, port) of the server the run needs, or None."""
    for params in self_hosted_agents(context):
        scheme_host = params.language_model_server_scheme_host.rstrip("/")
        host = urlparse(scheme_host).hostname or "127.0.0.1"
        return scheme_host, host, params.language_model_server_port
    return None


def server_engine(context: IterationContext) -> str:
    """The engine to start the server with: NIP_LM_SERVER_ENGINE when set, else the first
    self-hosted agent's `language_model_server_engine`, else transformers."""
    if os.environ.get(ENGINE_ENV):
        return os.environ[ENGINE_ENV]
    for params in context.agent_params.values():
        if provider_of(params).self_hosted and params.language_model_server_engine:
            return params.language_model_server_engine
    return "transformers"


def server_options(context: IterationContext, engine: str) -> list[str]:
    """Our server's engine and training flags from the self-hosted agents' settings: vLLM's
    port, parallelism, memory share, context length and LoRA rank limit; GPUs per training job."""
    agents = self_hosted_agents(context)
    if not agents:
        return []
    first = agents[0]
    options = ["--train-processes", str(first.training_num_processes)]
    if first.training_deepspeed_config:
        options += ["--train-deepspeed-config", first.training_deepspeed_config]
    if engine != "vllm":
        return options
    options += [
        "--vllm-port", str(first.vllm_server_port),
        "--vllm-tensor-parallel-size", str(first.vllm_tensor_parallel_size),
        "--vllm-data-parallel-size", str(first.vllm_data_parallel_size),
        "--vllm-gpu-memory-utilization", str(first.vllm_gpu_memory_utilization),
        "--vllm-max-lora-rank", str(max(p.lora_rank for p in agents)),
    ]  # fmt: skip
    if first.vllm_max_model_len is not None:
        options += ["--vllm-max-model-len", str(first.vllm_max_model_len)]
    if first.vllm_enforce_eager:
        options += ["--vllm-enforce-eager"]
    return options


def ensure_lm_server(
    paths: RunPaths, context: IterationContext, timeout: float | None = None
) -> ServerHandle | None:
    """The run's server: None when no agent is self-hosted, a handle without a process when it
    already answers, else a server started on this machine (RuntimeError for a remote host)."""
    endpoint = self_hosted_endpoint(context)
    if endpoint is None:
        return None
    scheme_host, host, port = endpoint
    url = f"{scheme_host}:{port}"
    if is_up(url):
        return ServerHandle(url, None)
    if host not in LOOPBACK:
        raise RuntimeError(f"the language-model server at {url} does not answer; start it there")
    state_dir = Path(paths.run_dir) / LM_SERVER_DIR if paths.is_local else None
    engine = server_engine(context)
    return start_server(url, port, engine, server_options(context, engine), state_dir, timeout)


@contextlib.contextmanager
def lm_server_for(paths: RunPaths, context: IterationContext) -> Iterator[ServerHandle | None]:
    """`ensure_lm_server` for the duration of a block; a server it started stops afterwards."""
    server = ensure_lm_server(paths, context)
    try:
        yield server
    finally:
        if server is not None:
            server.stop()
