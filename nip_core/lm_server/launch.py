"""Start the self-hosted language-model server when a run needs it and nothing answers.

The server is started in its own session (it outlives a killed flow, so a rerun re-attaches to
it and to its fine-tune jobs) with its state under the run folder. A flow stops only a server it
started itself.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx

from nip_core.agents.clients import provider_of
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_context import IterationContext

log = logging.getLogger(__name__)
ENGINE_ENV = "NIP_LM_SERVER_ENGINE"  # transformers | vllm | dummy; beats the config key


@dataclass
class ServerHandle:
    url: str
    process: subprocess.Popen | None  # None: it was already running

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def self_hosted_endpoint(context: IterationContext) -> tuple[str, str, int] | None:
    """(scheme://host, host, port) of the server the run needs, or None."""
    for params in context.agent_params.values():
        if provider_of(params).self_hosted and not params.use_dummy_api:
            scheme_host = params.language_model_server_scheme_host.rstrip("/")
            return (
                scheme_host,
                urlparse(scheme_host).hostname or "127.0.0.1",
                params.language_model_server_port,
            )
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
    agents = [
        p
        for p in context.agent_params.values()
        if provider_of(p).self_hosted and not p.use_dummy_api
    ]
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


def is_up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def ensure_lm_server(
    paths: RunPaths, context: IterationContext, timeout: float | None = None
) -> ServerHandle | None:
    endpoint = self_hosted_endpoint(context)
    if endpoint is None:
        return None
    scheme_host, host, port = endpoint
    url = f"{scheme_host}:{port}"
    if is_up(url):
        return ServerHandle(url, None)
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise RuntimeError(f"the language-model server at {url} does not answer; start it there")
    state_dir = Path(paths.run_dir) / "lm_server" if paths.is_local else None
    engine = server_engine(context)
    if timeout is None:  # the server answers once vLLM is up: minutes on a busy CPU
        timeout = 1800.0 if engine == "vllm" else 600.0
    command = [
        sys.executable, "-m", "nip_core.lm_server",
        "--engine", engine, "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    command += server_options(context, engine)
    if state_dir is not None:
        state_dir.mkdir(parents=True, exist_ok=True)
        command += ["--state-dir", str(state_dir)]
    log_path = (state_dir or Path(".")) / "server.log"
    log.warning("starting the language-model server on %s (log: %s)", url, log_path)
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + timeout
    while not is_up(url):
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(
                f"the language-model server exited with {process.returncode}:\n{tail}"
            )
        if time.monotonic() > deadline:
            process.kill()
            raise TimeoutError(f"the language-model server did not start within {timeout} s")
        time.sleep(0.5)
    return ServerHandle(url, process)
