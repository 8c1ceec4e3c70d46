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
from typing import Any

import httpx

from nip_core.agents.openai_client import OpenAIChatClient, _TransientError
from nip_core.agents.retry import is_transient_status, parse_retry_after


class DirectHttpChatClient(OpenAIChatClient):
    """`OpenAIChatClient` with the request posted by httpx instead of the SDK."""

    def __init__(self, base_url: str, api_key_env: str | None, **kwargs: Any) -> None:
        super().__init__(base_url, api_key_env, **kwargs)
        self._http: httpx.AsyncClient | None = None

    def _bind_http(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._http is None or self._semaphore is None:
            headers = {"Authorization": f"Bearer {self._api_key()}"}
            limits = httpx.Limits(
                max_connections=self.max_concurrency,
                max_keepalive_connections=self.max_concurrency,
            )
            self._http = httpx.AsyncClient(
                base_url=self.base_url or "", headers=headers, timeout=self.timeout, limits=limits
            )
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
            self._loop = loop
        return self._http, self._semaphore

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http, self._semaphore, self._loop = None, None, None

    async def _create_once(self, kwargs: dict[str, Any]) -> tuple[list[str], list[str]]:
        http, semaphore = self._bind_http()
        model = kwargs["model"]
        body = {k: v for k, v in kwargs.items() if k != "extra_body"}
        body.update(kwargs.get("extra_body") or {})
        async with semaphore:
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
