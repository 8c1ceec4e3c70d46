"""vLLM inference engine: supervise a `vllm serve` child process and talk to it over HTTP.

vLLM runs as a separate process (own process group, output to a log file) so that the server can
stop it to hand the GPU to a training job and start it again afterwards. Adapters are loaded at run
time (`/v1/load_lora_adapter`) instead of restarting vLLM per model, and the engine remembers them
so a restart re-loads them. vLLM is the optional, GPU-only extra: `pip install '.[vllm]'`.

    engine = VllmEngine("/models/base", max_lora_rank=64)
    await engine.start()
    await engine.load_adapter("verifier-it1", "/runs/r1/verifier-it1")
    choices = await engine.chat(ChatRequest(model="verifier-it1", messages=[...], n=4))
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from nip_core.lm_server.engines.base import AdapterError, ChatChoice, ChatRequest

ALLOWED_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Flags the engine sets itself; passing them again in `extra_args` would silently conflict.
MANAGED_FLAGS = tuple(
    "--host --port --enable-lora --max-loras --max-lora-rank --max-cpu-loras "
    "--gpu-memory-utilization --quantization".split()
)
_SAMPLING_FIELDS = ("temperature", "top_p", "max_tokens", "seed", "repetition_penalty")
_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_LOG_TAIL_LINES = 40


class VllmError(RuntimeError):
    """vLLM failed to start, crashed, or answered with a server error."""


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
        raise AdapterError(f"adapter path {str(root)!r} has no adapter_config.json")
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


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _log_tail(log_path: Path, offset: int, lines: int = _LOG_TAIL_LINES) -> str:
    """The last `lines` lines the current vLLM process wrote (it starts at byte `offset`)."""
    try:
        with log_path.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return "(log unavailable)"
    return "\n".join(text.splitlines()[-lines:]) or "(log empty)"


def _error_message(response: httpx.Response) -> str:
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


def _choices(body: Any, n: int) -> list[ChatChoice]:
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
    """`InferenceEngine` backed by a supervised `vllm serve` process (GPU only)."""

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
        extra_args: Sequence[str] = (),
        vllm_executable: str = "vllm",
        startup_timeout: float = 600,
        stop_grace: float = 30,
        request_timeout: float = 600,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.config = VllmServeConfig(
            model=model,
            host=host,
            port=port,
            max_loras=max_loras,
            max_lora_rank=max_lora_rank,
            max_cpu_loras=max_cpu_loras,
            gpu_memory_utilization=gpu_memory_utilization,
            quantization=quantization,
            extra_args=tuple(extra_args),
            vllm_executable=vllm_executable,
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
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._client: httpx.AsyncClient | None = None
        self._adapters: dict[str, str] = {}  # loaded (or to re-load on start): name -> path
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
        if self._proc is None:
            return "not_running"
        code = self._proc.poll()
        return "online" if code is None else f"crashed (exit code {code})"

    def log_tail(self) -> str:
        """The end of the current (or last) vLLM process's log, for error reports."""
        return _log_tail(self.log_path, self._log_offset)

    async def _start_locked(self) -> None:
        if self._is_running():
            return
        await self._stop_locked()  # a crashed leader may have left workers holding the GPU
        if _port_in_use(self.config.host, self.config.port):
            raise VllmError(
                f"port {self.config.port} on {self.config.host} is already in use; "
                "stop the other server or choose another port"
            )
        self._launch()
        self._client = httpx.AsyncClient(
            base_url=self.config.base_url,
            timeout=httpx.Timeout(self.request_timeout, connect=10),
            trust_env=False,  # never route localhost traffic through an HTTP proxy from the env
        )
        try:
            await self._wait_healthy()
        except BaseException:
            await self._stop_locked()
            raise
        await self._reload_adapters()

    def _launch(self) -> None:
        cmd = vllm_command(self.config)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n==== nip: launching {' '.join(cmd)}\n".encode())
            log.flush()
            self._log_offset = log.tell()
            try:
                self._proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=vllm_env(),
                    start_new_session=True,  # own process group: stop() reaches its workers
                )
            except FileNotFoundError as exc:
                raise VllmError(
                    f"vLLM executable {self.config.vllm_executable!r} not found; "
                    "install the GPU extra with: pip install '.[vllm]'"
                ) from exc

    async def _wait_healthy(self) -> None:
        assert self._proc is not None and self._client is not None
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.05
        while True:
            code = self._proc.poll()
            if code is not None:
                raise VllmError(
                    f"vLLM exited with code {code} during start-up; log tail "
                    f"({self.log_path}):\n{self.log_tail()}"
                )
            try:
                response = await self._client.get("/v1/models", timeout=5)
                if response.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise VllmError(
                    f"vLLM did not become healthy within {self.startup_timeout:g} s; log tail "
                    f"({self.log_path}):\n{self.log_tail()}"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _stop_locked(self) -> None:
        proc, self._proc = self._proc, None
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if proc is None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        # Also reaps workers that outlived the leader.
        _signal_group(proc.pid, signal.SIGKILL)
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired as exc:
            raise VllmError(f"vLLM (pid {proc.pid}) did not exit even after SIGKILL") from exc

    async def _reload_adapters(self) -> None:
        failed = []
        for name, path in list(self._adapters.items()):
            try:
                await self._post_load(name, path)
            except AdapterError as exc:
                del self._adapters[name]
                failed.append(str(exc))
        if failed:
            raise AdapterError("could not re-load adapters after start: " + "; ".join(failed))

    # ---- serving --------------------------------------------------------------------------

    def models(self) -> list[str]:
        """The base model followed by the adapters that are (or will be, on start) loaded."""
        return [self.config.model, *self._adapters]

    async def chat(self, request: ChatRequest) -> list[ChatChoice]:
        """Forward one chat completion (n samples) to vLLM and map its errors."""
        body: dict[str, Any] = {"model": request.model, "messages": request.messages}
        body["n"] = request.n
        for key in _SAMPLING_FIELDS:
            value = getattr(request, key)
            if value is not None:
                body[key] = value
        response = await self._post("/v1/chat/completions", body)
        if response.status_code == 404:
            raise AdapterError(
                f"vLLM does not serve model {request.model!r} ({_error_message(response)}); "
                f"served: {', '.join(self.models())}"
            )
        if 400 <= response.status_code < 500:
            raise ValueError(f"vLLM rejected the chat request: {_error_message(response)}")
        self._raise_for_server_error(response, "chat completion")
        return _choices(response.json(), request.n)

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
                        f"vLLM could not unload adapter {name!r}: {_error_message(response)}"
                    )
            del self._adapters[name]

    async def _post_load(self, name: str, path: str) -> None:
        response = await self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        self._raise_for_server_error(response, f"loading adapter {name!r}")
        if response.status_code >= 400:
            raise AdapterError(
                f"vLLM could not load adapter {name!r} from {path}: {_error_message(response)}"
            )

    # ---- HTTP plumbing --------------------------------------------------------------------

    def _is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _not_serving_error(self) -> VllmError:
        if self._proc is None:
            return VllmError("vLLM is not running: call start() or reacquire_accelerator() first")
        return VllmError(
            f"vLLM crashed ({self.status()}); log tail ({self.log_path}):\n{self.log_tail()}"
        )

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
            crashed = "" if self._is_running() else f"\nlog tail:\n{self.log_tail()}"
            raise VllmError(
                f"vLLM failed {what} (HTTP {response.status_code}): "
                f"{_error_message(response)}{crashed}"
            )


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


VLLMEngine = VllmEngine  # the name `make_engine` imports
