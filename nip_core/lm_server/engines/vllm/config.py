"""What `vllm serve` is launched with: validated options, the command line and its environment.

Pure functions, so the exact command line is unit-testable without vLLM. Also reads a PEFT
adapter's rank, which must fit under `--max-lora-rank`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nip_core.lm_server.engines.base import AdapterError

ALLOWED_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Flags the engine sets itself; passing them again in `extra_args` would silently conflict.
MANAGED_FLAGS = tuple(
    "--host --port --enable-lora --max-loras --max-lora-rank --max-cpu-loras "
    "--gpu-memory-utilization --quantization --tensor-parallel-size --data-parallel-size "
    "--max-model-len".split()
)
_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def lora_rank_bucket(rank: int) -> int:
    """The smallest rank vLLM accepts for `--max-lora-rank` that is >= `rank`."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"max_lora_rank must be a positive integer, got {rank!r}")
    for allowed in ALLOWED_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(
        f"max_lora_rank {rank} exceeds vLLM's largest LoRA rank {ALLOWED_LORA_RANKS[-1]}"
    )


def _check_extra_args(extra_args: tuple[str, ...]) -> None:
    for arg in extra_args:
        if not isinstance(arg, str):
            raise ValueError(f"extra_args must be strings, got {arg!r}")
        if arg.split("=", 1)[0] in MANAGED_FLAGS:
            raise ValueError(
                f"extra_args may not set {arg.split('=', 1)[0]}: use the engine option"
            )


@dataclass(frozen=True)
class VllmServeConfig:
    """How to launch `vllm serve`; validated and normalised on construction.

    `max_lora_rank` is rounded up to a rank vLLM accepts; `max_cpu_loras` defaults to `max_loras`
    (vLLM's own default); `quantization="none"` means no quantization.
    """

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    max_loras: int = 2
    max_lora_rank: int = 64
    max_cpu_loras: int | None = None
    gpu_memory_utilization: float = 0.85
    quantization: str | None = None
    tensor_parallel_size: int = 1  # GPUs one model instance is split over
    data_parallel_size: int = 1  # model instances behind one server
    max_model_len: int | None = None  # None: the model's own context length
    extra_args: tuple[str, ...] = field(default=())
    vllm_executable: str = "vllm"

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must be a non-empty model name or path")
        if not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise ValueError(f"port must be an integer in 1..65535, got {self.port!r}")
        if not (isinstance(self.max_loras, int) and self.max_loras >= 1):
            raise ValueError(f"max_loras must be an integer >= 1, got {self.max_loras!r}")
        cpu_loras = self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras
        if not (isinstance(cpu_loras, int) and cpu_loras >= self.max_loras):
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras!r}) must be an integer >= "
                f"max_loras ({self.max_loras})"
            )
        for name in ("tensor_parallel_size", "data_parallel_size"):
            size = getattr(self, name)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {size!r}")
        if self.max_model_len is not None and not (
            isinstance(self.max_model_len, int) and self.max_model_len >= 1
        ):
            raise ValueError(f"max_model_len must be None or >= 1, got {self.max_model_len!r}")
        gmu = self.gpu_memory_utilization
        if not (isinstance(gmu, int | float) and math.isfinite(gmu) and 0 < gmu <= 1):
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gmu!r}")
        quant = None if self.quantization in (None, "", "none") else self.quantization
        extra = tuple(self.extra_args)
        _check_extra_args(extra)
        # Frozen dataclass: normalised values are written once, here.
        object.__setattr__(self, "max_lora_rank", lora_rank_bucket(self.max_lora_rank))
        object.__setattr__(self, "max_cpu_loras", cpu_loras)
        object.__setattr__(self, "quantization", quant)
        object.__setattr__(self, "extra_args", extra)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def vllm_command(config: VllmServeConfig) -> list[str]:
    """The argv that launches vLLM's OpenAI-compatible server with runtime LoRA support."""
    cmd = [config.vllm_executable, "serve", config.model]
    cmd += ["--host", config.host, "--port", str(config.port), "--enable-lora"]
    cmd += ["--max-loras", str(config.max_loras), "--max-lora-rank", str(config.max_lora_rank)]
    cmd += ["--max-cpu-loras", str(config.max_cpu_loras)]
    cmd += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    if config.quantization:
        cmd += ["--quantization", config.quantization]
    if config.tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
    if config.data_parallel_size > 1:
        cmd += ["--data-parallel-size", str(config.data_parallel_size)]
    if config.max_model_len is not None:
        cmd += ["--max-model-len", str(config.max_model_len)]
    return cmd + list(config.extra_args)


def vllm_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: `base` (default: ours) plus the switch for runtime LoRA loading."""
    env = dict(os.environ if base is None else base)
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    return env


def adapter_rank(path: str | os.PathLike[str]) -> int:
    """The largest LoRA rank in a PEFT adapter directory, checking it is loadable at all."""
    root = Path(path)
    if not root.is_dir():
        raise AdapterError(f"adapter path {str(root)!r} does not exist or is not a directory")
    config_file = root / "adapter_config.json"
    if not config_file.is_file():
        raise AdapterError(
            f"adapter path {str(root)!r} has no adapter_config.json; vLLM loads only LoRA "
            "adapters at run time (serve a full fine-tune as its own base model)"
        )
    if not any((root / name).is_file() for name in _WEIGHT_FILES):
        raise AdapterError(f"adapter path {str(root)!r} has no {' or '.join(_WEIGHT_FILES)}")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"cannot read {config_file}: {exc}") from exc
    ranks = [config.get("r")] + list((config.get("rank_pattern") or {}).values())
    if not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in ranks):
        raise AdapterError(f"{config_file} must give a positive integer LoRA rank 'r'")
    return max(ranks)
