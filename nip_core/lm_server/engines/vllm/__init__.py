"""vLLM inference engine: supervise a `vllm serve` child process and talk to it over HTTP.

vLLM runs as a separate process (own process group, output to a log file) so that the server can
stop it to hand the GPU to a training job and start it again afterwards. Adapters are loaded at run
time (`/v1/load_lora_adapter`) instead of restarting vLLM per model, and the engine remembers them
so a restart re-loads them. vLLM is the optional, GPU-only extra: `pip install '.[vllm]'`; this
package itself imports only httpx, so it loads (and is tested) without vLLM.

    engine = VllmEngine("/models/base", max_lora_rank=64)
    await engine.start()
    await engine.load_adapter("verifier-it1", "/runs/r1/verifier-it1")
    choices = await engine.chat(ChatRequest(model="verifier-it1", messages=[...], n=4))

Modules: `config` (options, command line, environment), `process` (launch and end the child),
`engine` (the `InferenceEngine`).
"""

from nip_core.lm_server.engines.vllm.config import (
    ALLOWED_LORA_RANKS,
    MANAGED_FLAGS,
    VllmServeConfig,
    adapter_rank,
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
    "lora_rank_bucket",
    "vllm_command",
    "vllm_env",
]
