"""A lighter request path for servers we know speak OpenAI's chat JSON (ours, vLLM).

`DirectHttpChatClient` behaves exactly like `OpenAIChatClient` (same retries, top-up, error
classification and reply checks) but posts the JSON itself over one keep-alive
`httpx.AsyncClient` whose pool matches the concurrency, skipping the SDK's request building,
which costs a noticeable share of the client's CPU per call at thousands of calls per second.
The `openai` SDK stays the path for OpenAI and OpenRouter (and for fine-tuning everywhere).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import httpx

from nip_core.agents.openai_client import OpenAIChatClient, _TransientError
from nip_core.agents.retry import is_transient_status, parse_retry_after

# httpcore's pool bookkeeping scans its connections (and, for idle ones, the whole list again)
# every time a request starts or ends, so its CPU per request grows with the square of the pool:
# measured here, one pool of 1,000+ connections spent 10 ms per call on it. Many small pools,
# each with its own bound, keep that scan short at any concurrency.
CONNECTIONS_PER_POOL = 8


class DirectHttpChatClient(OpenAIChatClient):
    """`OpenAIChatClient` with the request posted by httpx instead of the SDK."""

    def __init__(self, base_url: str, api_key_env: str | None, **kwargs: Any) -> None:
        super().__init__(base_url, api_key_env, **kwargs)
        self._pools: list[tuple[httpx.AsyncClient, asyncio.Semaphore]] = []
        self._ssl: ssl.SSLContext | None = None
        self._turn = 0

    def _new_pool(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        if self._ssl is None:  # built once: loading the CA bundle costs milliseconds
            self._ssl = ssl.create_default_context()
        size = min(CONNECTIONS_PER_POOL, self.max_concurrency)
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
        http = httpx.AsyncClient(
            base_url=self.base_url or "",
            headers={"Authorization": f"Bearer {self._api_key()}"},
            timeout=self.timeout,
            limits=limits,
            verify=self._ssl,
        )
        return http, asyncio.Semaphore(size)  # nothing queues inside httpcore

    def _bind_loop(self) -> asyncio.Semaphore:
        """The bound on requests in flight across all pools; pools and bound belong to one
        event loop, so a new loop starts afresh."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._semaphore is None:
            self._pools, self._loop = [], loop
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
        return self._semaphore

    def _pick_pool(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """A pool with a free connection, adding pools up to the concurrency as load grows."""
        for pool in self._pools:
            if not pool[1].locked():
                return pool
        if len(self._pools) * CONNECTIONS_PER_POOL < self.max_concurrency:
            self._pools.append(self._new_pool())
            return self._pools[-1]
        self._turn = (self._turn + 1) % len(self._pools)  # all busy: queue round robin
        return self._pools[self._turn]

    async def aclose(self) -> None:
        pools, self._pools, self._loop, self._semaphore = self._pools, [], None, None
        await asyncio.gather(*(http.aclose() for http, _ in pools))

    async def _create_once(self, kwargs: dict[str, Any]) -> tuple[list[str], list[str]]:
        async with self._bind_loop():
            http, pool_slots = self._pick_pool()
            async with pool_slots:
                return await self._post(http, kwargs)

    async def _post(
        self, http: httpx.AsyncClient, kwargs: dict[str, Any]
    ) -> tuple[list[str], list[str]]:
        """One request on `http`; transient failures become `_TransientError`."""
        model = kwargs["model"]
        body = {k: v for k, v in kwargs.items() if k != "extra_body"}
        body.update(kwargs.get("extra_body") or {})
        self.calls += 1
        try:
            response = await http.post(
                "/chat/completions",
                content=json.dumps(body),
                headers={"Content-Type": "application/json"},
            )
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            raise _TransientError(f"{type(exc).__name__}: {exc}", None) from None
        if response.status_code >= 400:
            detail = f"HTTP {response.status_code}: {_error_message(response)}"
            if is_transient_status(response.status_code):
                retry_after = parse_retry_after(response.headers)
                raise _TransientError(detail, response.status_code, retry_after)
            raise self._permanent(detail, model, response.status_code)
        return self._read_reply(response, model)


def _error_message(response: httpx.Response) -> str:
    """The `error.message` of an OpenAI-shaped error body, else the start of the body."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]
