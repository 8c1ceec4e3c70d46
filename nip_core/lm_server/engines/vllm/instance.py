"""One running vLLM server (process + HTTP client) and the errors it can answer with.

The engine keeps one instance (runtime LoRA: the base model and its adapters) or several, one
per served checkpoint (merged LoRA on CPU); each counts the requests it has in flight so that
only an idle instance is stopped to make room for another.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx

from nip_core.lm_server.engines.vllm.admission import SequenceGate
from nip_core.lm_server.engines.vllm.config import VllmServeConfig
from nip_core.lm_server.engines.vllm.process import (
    VllmError,
    VllmProcess,
    end_stale_vllm,
    port_in_use,
)

log = logging.getLogger(__name__)


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


class VllmInstance:
    """A vLLM server for `config`: launched by `launch()`, ended by `stop()`."""

    def __init__(self, config: VllmServeConfig, log_path: Path, request_timeout: float) -> None:
        self.config = config
        self.log_path = log_path
        self.request_timeout = request_timeout
        self.process: VllmProcess | None = None
        self.client: httpx.AsyncClient | None = None
        self.launch_name = config.name  # what vLLM calls the model, even after a reload
        self.inflight = 0  # requests being served (the engine's lock guards this count)
        self.ready = False  # launched and healthy
        self.last_used = time.monotonic()
        capacity = config.admitted_sequences
        self.gate = SequenceGate(capacity) if capacity is not None else None

    async def launch(self, startup_timeout: float) -> None:
        """Start the process and wait until it answers `/v1/models` (stopped again on failure)."""
        stale = await asyncio.to_thread(end_stale_vllm, self.log_path, self.config.port)
        if stale is not None:
            log.warning(
                "ended the vLLM (pid %d) a killed server left on port %d", stale, self.config.port
            )
        if port_in_use(self.config.host, self.config.port):
            raise VllmError(
                f"port {self.config.port} on {self.config.host} is already in use; "
                "stop the other server or choose another port"
            )
        self.process = VllmProcess(self.config, self.log_path)
        self.client = httpx.AsyncClient(
            base_url=self.config.base_url,
            timeout=httpx.Timeout(self.request_timeout, connect=10),
            # vLLM's uvicorn closes idle connections after 5 s: ours close first, or a request on
            # a connection it is closing comes back as "connection reset by peer"
            limits=httpx.Limits(keepalive_expiry=2.0),
            trust_env=False,  # never route localhost traffic through an HTTP proxy from the env
        )
        try:
            await self._wait_healthy(startup_timeout)
        except BaseException:
            await self.stop(0)
            raise
        self.ready = True

    async def _wait_healthy(self, startup_timeout: float) -> None:
        process, client = self.process, self.client
        assert process is not None and client is not None
        deadline = time.monotonic() + startup_timeout
        delay = 0.05
        while (code := process.exit_code()) is None:
            try:
                if (await client.get("/v1/models", timeout=5)).status_code == 200:
                    return
            except (httpx.TransportError, RuntimeError):  # RuntimeError: stop() closed the client
                pass
            if time.monotonic() > deadline:
                raise VllmError(
                    f"vLLM did not become healthy within {startup_timeout:g} s; {process.tail()}"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        raise VllmError(f"vLLM exited with code {code} during start-up; {process.tail()}")

    async def reload(self, config: VllmServeConfig) -> None:
        """Load the weights of `config.model` in place (same architecture and tokenizer) and
        drop the prefix cache, whose blocks the old weights computed; `config` is ours then."""
        for route, body in (
            (
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": config.model}},
            ),
            ("/reset_prefix_cache", {}),
        ):
            response = await self.post(route, body)
            if response.status_code >= 400:
                raise VllmError(
                    f"vLLM could not load the weights of {config.model} in place "
                    f"({route}: HTTP {response.status_code}): {error_message(response)}"
                )
        self.config = config

    async def stop(self, grace: float) -> None:
        """SIGTERM the process group, SIGKILL after `grace` seconds."""
        self.ready = False
        process, self.process = self.process, None
        if self.client is not None:
            await self.client.aclose()
            self.client = None
        if process is not None:
            await process.terminate(grace)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.exit_code()

    def is_running(self) -> bool:
        return self.process is not None and self.process.exit_code() is None

    def status(self) -> str:
        """`online` (process alive), `not_running`, or `crashed (exit code N)`."""
        if self.process is None:
            return "not_running"
        code = self.process.exit_code()
        return "online" if code is None else f"crashed (exit code {code})"

    def not_serving_error(self) -> VllmError:
        if self.process is None:
            return VllmError("vLLM is not running: call start() or reacquire_accelerator() first")
        return VllmError(f"vLLM crashed ({self.status()}); {self.process.tail()}")

    async def post(self, route: str, body: dict[str, Any], sequences: int = 0) -> httpx.Response:
        """POST `body`; a request that generates or scores `sequences` > 0 first waits for room
        at the gate, so the request timeout counts from when vLLM can take it."""
        if sequences > 0 and self.gate is not None:
            async with self.gate.admit(sequences):
                return await self._post(route, body)
        return await self._post(route, body)

    async def _post(self, route: str, body: dict[str, Any]) -> httpx.Response:
        if not self.is_running() or self.client is None:
            raise self.not_serving_error()
        try:
            return await self.client.post(route, json=body)
        except httpx.TransportError as exc:
            if not self.is_running():
                raise self.not_serving_error() from exc
            raise VllmError(f"cannot reach vLLM at {self.config.base_url}{route}: {exc!r}") from exc

    def raise_for_server_error(self, response: httpx.Response, what: str) -> None:
        if response.status_code >= 500:
            crashed = "" if self.is_running() else f"; {self.not_serving_error()}"
            raise VllmError(
                f"vLLM failed {what} (HTTP {response.status_code}): "
                f"{error_message(response)}{crashed}"
            )
