"""`DirectHttpChatClient`: chat for every OpenAI-compatible endpoint (OpenAI, OpenRouter, our
server, a vLLM server of one's own), posted by aiohttp without the `openai` SDK.

It sends what the SDK would: the JSON body, `Authorization: Bearer <key>` and, when set,
`OPENAI_ORG_ID` / `OPENAI_PROJECT_ID` as `OpenAI-Organization` / `OpenAI-Project`; with no base
URL it goes where the SDK goes (`$OPENAI_BASE_URL`, else https://api.openai.com/v1), following
redirects. On top: our own retry policy (`RetryPolicy.call`; HTTP 429 is retried, nip §8.21), a
concurrency bound, the reply checks of `chat_replies`, and fewer-choices-than-`n` top-up.
Transient failures are retried with back-off; once retries run out they raise
`ModelCallError(transient=True)`. At thousands of calls per second the client's CPU per call
is what limits a rollout stage: with 256 requests in flight against a loopback server, httpx
spent 2.0 ms of CPU a call here and aiohttp 0.33 ms (`bench/rollout_http.py` measures the whole
stage). The SDK stays the path for files and fine-tuning jobs (`nip_core.training`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from nip_core.agents.chat_client import ModelCallError, SamplingParams, check_request
from nip_core.agents.chat_replies import (
    HttpReply,
    ProviderError,
    TransientCallError,
    openai_error_message,
    read_reply,
    request_body,
)
from nip_core.agents.retry import RetryPolicy, is_transient_status, parse_retry_after

log = logging.getLogger(__name__)

OPENAI_BASE_URL = "https://api.openai.com/v1"  # the SDK's default, as is its variable below
BASE_URL_ENV = "OPENAI_BASE_URL"
# The SDK's optional account headers, read from the same variables.
ACCOUNT_HEADERS = {"OpenAI-Organization": "OPENAI_ORG_ID", "OpenAI-Project": "OPENAI_PROJECT_ID"}
_INVALID_CHOICE_RETRIES = 3  # content-filtered / empty answers tolerated per `complete`
# An idle connection is dropped before the common 5 s keep-alive of servers (uvicorn's, httpx's):
# reusing one the server has just closed costs a failed request and a back-off.
KEEPALIVE_SECONDS = 4.0
# Timeouts, connection resets, a reply cut short: worth asking again.
_NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def env_proxy(url: str) -> tuple[str | None, aiohttp.BasicAuth | None]:
    """The proxy (and its credentials) that HTTPS_PROXY / HTTP_PROXY / ALL_PROXY name for `url`,
    None where NO_PROXY exempts it or none is set: what the SDK's httpx client would use."""
    try:
        proxy, auth = get_env_proxy_for_url(URL(url))
    except LookupError:
        return None, None
    return str(proxy), auth


def endpoint_url(base_url: str | None) -> str:
    """Where chat requests go: `base_url`, else `$OPENAI_BASE_URL`, else OpenAI's API."""
    return (base_url or os.environ.get(BASE_URL_ENV) or OPENAI_BASE_URL).rstrip("/")


class DirectHttpChatClient:
    """`ChatClient` over aiohttp, with our own retries and a concurrency bound.

    Counters: `calls` = HTTP requests sent (attempts), `retries` = requests repeated after a
    transient failure or an unusable answer.
    """

    def __init__(
        self,
        base_url: str | None,
        api_key_env: str | None,
        *,
        max_concurrency: int = 32,
        timeout: float = 120.0,
        max_retries: int = 6,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0 or timeout <= 0 or backoff_base < 0 or backoff_max < 0:
            raise ValueError("max_retries, backoff_base, backoff_max must be >= 0, timeout > 0")
        self.base_url = base_url  # None: the SDK's default (see `endpoint_url`)
        self.url = endpoint_url(base_url)
        self.api_key_env = api_key_env
        self.max_concurrency = max_concurrency
        self.timeout, self.max_retries = timeout, max_retries
        self.retry_policy = RetryPolicy(max_retries + 1, backoff_base, backoff_max)
        self.__key = self._read_key(api_key_env)
        self.calls = 0
        self.retries = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closer: AsyncGenerator[None, None] | None = None
        self._ssl: ssl.SSLContext | None = None
        self._proxy: tuple[str | None, aiohttp.BasicAuth | None] = (None, None)

    @staticmethod
    def _read_key(api_key_env: str | None) -> str:
        if api_key_env is None:
            return "EMPTY"  # servers without auth (vLLM) still want a non-empty key
        key = os.environ.get(api_key_env)
        if not key:
            raise ValueError(f"environment variable {api_key_env} is not set (API key)")
        return key

    def __repr__(self) -> str:
        return (
            f"DirectHttpChatClient(base_url={self.base_url!r}, api_key_env={self.api_key_env!r}, "
            f"max_concurrency={self.max_concurrency})"
        )

    __str__ = __repr__

    def __getstate__(self) -> None:
        raise TypeError("a chat client holds a secret and a connection pool; do not pickle it")

    def _redact(self, text: str) -> str:
        key = self.__key
        return text.replace(key, "***") if key and key != "EMPTY" else text

    def _permanent(self, what: str, model: str, status: int | None) -> ModelCallError:
        return ModelCallError(
            self._redact(f"{what} (model {model!r} at {self.url})"), status=status
        )

    def _headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.__key}", "Accept": "application/json"}
        for header, variable in ACCOUNT_HEADERS.items():
            if os.environ.get(variable):
                headers[header] = os.environ[variable]
        return headers

    # ------------------------------------------------------------ the connection pool

    def _new_session(self) -> aiohttp.ClientSession:
        if self._ssl is None and self.url.startswith("https:"):
            self._ssl = ssl.create_default_context()  # once: loading the CA bundle takes ~30 ms
        connector = aiohttp.TCPConnector(
            limit=self.max_concurrency,
            ssl=self._ssl or True,  # True: aiohttp's default verification (an https redirect)
            keepalive_timeout=KEEPALIVE_SECONDS,
        )
        t = self.timeout  # per phase, as httpx's: waiting for a connection, connecting, reading
        timeout = aiohttp.ClientTimeout(total=None, connect=t, sock_connect=t, sock_read=t)
        # The environment's proxy for our URL, read once: with `trust_env` aiohttp looks it up
        # (and reads ~/.netrc) in a thread on every request, ~40 % of its CPU per call here.
        self._proxy = env_proxy(self.url)
        return aiohttp.ClientSession(connector=connector, headers=self._headers(), timeout=timeout)

    def _bind_loop(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        """The session and the bound on requests in flight; both belong to one event loop, so
        a new loop starts afresh."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._session is None or self._semaphore is None:
            self._loop, self._session = loop, self._new_session()
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
            self._closer = _closed_at_loop_end(self._session)
        return self._session, self._semaphore

    async def aclose(self) -> None:
        """Close the connection pool of the current loop."""
        closer, self._closer = self._closer, None
        self._session, self._loop, self._semaphore = None, None, None
        if closer is not None:
            await closer.aclose()

    # ------------------------------------------------------------ requests

    async def _create_once(self, body: dict[str, Any]) -> tuple[list[str], list[str]]:
        """One HTTP request; transient failures raise `TransientCallError`."""
        session, in_flight = self._bind_loop()
        async with in_flight:
            return await self._post(session, body)

    async def _post(self, session: aiohttp.ClientSession, body: dict[str, Any]) -> tuple:
        model = body["model"]
        self.calls += 1
        try:
            async with session.post(
                f"{self.url}/chat/completions",
                data=json.dumps(body),
                headers={"Content-Type": "application/json"},
                proxy=self._proxy[0],
                proxy_auth=self._proxy[1],
            ) as reply:
                response = HttpReply(reply.status, reply.headers, await reply.read())
        except _NETWORK_ERRORS as exc:
            raise TransientCallError(f"{type(exc).__name__}: {exc}", None) from None
        if response.status_code >= 400:
            detail = f"HTTP {response.status_code}: {openai_error_message(response)}"
            if is_transient_status(response.status_code):
                retry_after = parse_retry_after(response.headers)
                raise TransientCallError(detail, response.status_code, retry_after)
            raise self._permanent(detail, model, response.status_code)
        try:
            return read_reply(response)
        except ProviderError as exc:
            raise self._permanent(exc.detail, model, exc.status) from None

    def _on_retry(self, error: BaseException, attempt: int, delay: float) -> None:
        reason = self._redact(getattr(error, "reason", str(error)))
        log.warning("model call failed (%s); retry %d in %.2fs", reason, attempt + 1, delay)
        self.retries += 1

    async def _create_with_retries(self, body: dict[str, Any]) -> tuple[list[str], list[str]]:
        try:
            return await self.retry_policy.call(
                "model call", lambda: self._create_once(body), self._on_retry
            )
        except TransientCallError as exc:
            raise ModelCallError(
                f"gave up after {self.retry_policy.attempts} attempts (model {body['model']!r} "
                f"at {self.url}): {self._redact(exc.reason)}",
                status=exc.status,
                transient=True,
                unreachable_url=self.url if exc.status is None else None,
            ) from None

    async def complete(
        self, messages: list[dict], model: str, n: int, sampling: SamplingParams
    ) -> list[str]:
        """`n` replies in choice order, topping up when the server returns fewer choices.

        Top-up requests shift `seed` by the number of texts already collected, so a seeded server
        that ignores `n` does not return the same text again.
        """
        check_request(messages, model, n, sampling)
        texts: list[str] = []
        invalid_left = _INVALID_CHOICE_RETRIES
        while len(texts) < n:
            seed = sampling.seed
            if seed is not None and texts:
                seed += len(texts)
            body = request_body(messages, model, n - len(texts), sampling, seed)
            good, bad = await self._create_with_retries(body)
            texts.extend(good)
            if bad or not good:
                reason = bad[0] if bad else "no choices returned"
                if invalid_left == 0:
                    raise self._permanent(f"unusable completion: {reason}", model, None)
                invalid_left -= 1
                self.retries += 1
                log.warning("unusable completion (%s); asking again", reason)
        return texts[:n]


def _closed_at_loop_end(session: aiohttp.ClientSession) -> AsyncGenerator[None, None]:
    """An async generator, started here, whose end closes `session`: the running loop holds
    every started async generator and `asyncio.run` ends them before it closes the loop, so a
    client its caller never closed still closes its connections in their own loop (aiohttp
    would warn of an unclosed session, and could not close its sockets on a dead loop)."""

    async def hold() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await session.close()

    closer = hold()
    with contextlib.suppress(StopIteration):  # runs to its `yield` at once: nothing to await
        closer.asend(None).send(None)
    return closer
