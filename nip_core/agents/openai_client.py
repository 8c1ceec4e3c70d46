"""`OpenAIChatClient`: any OpenAI-compatible endpoint (OpenAI, OpenRouter, our server, vLLM).

Our own retry policy (`nip_core.agents.retry`; HTTP 429 is retried, nip §8.21), a concurrency
bound and fewer-choices-than-`n` top-up. Transient failures (429, 408, 5xx, timeouts, dropped
connections and unreadable replies: a body that is not UTF-8, not JSON, e.g. a proxy's HTML
page, cut short, or JSON without a `choices` list) are retried with backoff; once retries run
out they raise `ModelCallError(transient=True)`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

import openai

from nip_core.agents.chat_client import (
    ModelCallError,
    SamplingParams,
    check_request,
)
from nip_core.agents.retry import RetryPolicy, is_transient_status, parse_retry_after

log = logging.getLogger(__name__)

_BODY_SNIPPET_CHARS = 80  # how much of an unreadable reply body an error message quotes
_INVALID_CHOICE_RETRIES = 3  # content-filtered / empty answers tolerated per `complete`


class _TransientError(Exception):
    """A failure worth retrying after a pause (rate limit, 5xx, timeout, connection)."""

    def __init__(self, reason: str, status: int | None, retry_after: float | None = None):
        super().__init__(reason)
        self.reason, self.status, self.retry_after = reason, status, retry_after


def _request_kwargs(
    messages: list[dict], model: str, n: int, sampling: SamplingParams, seed: int | None
) -> dict[str, Any]:
    """Keyword arguments for `chat.completions.create`, sending only what is set."""
    kwargs: dict[str, Any] = {"model": model, "messages": messages, "n": n}
    optional = (("temperature", sampling.temperature), ("top_p", sampling.top_p))
    optional += (("max_tokens", sampling.max_tokens), ("seed", seed))
    kwargs.update({name: value for name, value in optional if value is not None})
    if sampling.repetition_penalty is not None:
        kwargs["extra_body"] = {"repetition_penalty": sampling.repetition_penalty}
    return kwargs


class _UnreadableReply(Exception):
    """A 2xx reply whose body is not a chat completion (garbled, truncated, wrong shape)."""


def _decode_body(body: bytes) -> dict:
    """The JSON object in a reply body (`_UnreadableReply` naming what is wrong with it)."""
    if not body.strip():
        raise _UnreadableReply("empty body")
    try:
        data = json.loads(body)  # bytes: UTF-8 (with or without BOM), or UTF-16/32 like the SDK
    except UnicodeDecodeError as exc:
        raise _UnreadableReply(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        html = body.lstrip()[:1] == b"<"
        kind = "an HTML page, not JSON" if html else "not valid JSON (truncated or garbled)"
        raise _UnreadableReply(
            f"{kind} ({exc.msg}, line {exc.lineno} column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise _UnreadableReply(f"JSON {type(data).__name__}, not an object")
    return data


def _embedded_error(data: dict) -> dict | None:
    """OpenRouter reports some failures inside a 200 body as `{"error": {"code", "message"}}`."""
    error = data.get("error")
    return error if isinstance(error, dict) else None


def _split_choices(data: dict) -> tuple[list[str], list[str]]:
    """(usable texts in choice-index order, reasons for unusable choices).

    A body that is not shaped like a chat completion raises `_UnreadableReply`; an empty
    `choices` list, a filtered choice or one without content are well-formed but unusable.
    """
    choices = data.get("choices")
    if not isinstance(choices, list):
        what = "no 'choices'" if choices is None else f"'choices' is a {type(choices).__name__}"
        raise _UnreadableReply(f"not a chat completion: {what}, expected a list")
    parsed: list[tuple[int, Any, Any]] = []
    for position, choice in enumerate(choices):
        where = f"not a chat completion: choices[{position}]"
        if not isinstance(choice, dict):
            raise _UnreadableReply(f"{where} is a {type(choice).__name__}, not an object")
        index = choice.get("index", position)
        if not isinstance(index, int) or isinstance(index, bool):
            raise _UnreadableReply(f"{where}.index is {index!r}, not an int")
        message = choice.get("message")
        if message is not None and not isinstance(message, dict):
            raise _UnreadableReply(f"{where}.message is a {type(message).__name__}, not an object")
        content = message.get("content") if message is not None else None
        if content is not None and not isinstance(content, str):
            raise _UnreadableReply(f"{where}.message.content is a {type(content).__name__}")
        parsed.append((index, choice.get("finish_reason"), content))
    texts, bad = [], []
    for _, finish_reason, content in sorted(parsed, key=lambda c: c[0]):
        if finish_reason == "content_filter":
            bad.append("finish_reason 'content_filter'")
        elif content is None:
            bad.append(f"content is None (finish_reason {finish_reason!r})")
        else:
            texts.append(content)  # "length" is accepted: the truncated text is kept
    return texts, bad


def _unreadable_detail(http_response: Any, problem: str) -> str:
    """One line naming the status, content type, size and start of an unreadable reply."""
    body = http_response.content
    content_type = http_response.headers.get("content-type", "no content-type")
    snippet = body[:_BODY_SNIPPET_CHARS].decode("utf-8", "replace")
    more = "..." if len(body) > _BODY_SNIPPET_CHARS else ""
    return (
        f"unreadable reply (HTTP {http_response.status_code}, {content_type}, {len(body)} bytes):"
        f" {problem}; body starts {snippet!r}{more}"
    )


class OpenAIChatClient:
    """`ChatClient` over the `openai` SDK, with our own retries and a concurrency bound.

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
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.max_concurrency = max_concurrency
        self.timeout, self.max_retries = timeout, max_retries
        self.retry_policy = RetryPolicy(max_retries + 1, backoff_base, backoff_max)
        self.__key = self._read_key(api_key_env)
        self.calls = 0
        self.retries = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sdk: openai.AsyncOpenAI | None = None
        self._semaphore: asyncio.Semaphore | None = None

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
            f"OpenAIChatClient(base_url={self.base_url!r}, api_key_env={self.api_key_env!r}, "
            f"max_concurrency={self.max_concurrency})"
        )

    __str__ = __repr__

    def __getstate__(self) -> None:
        raise TypeError("OpenAIChatClient holds a secret and a connection pool; do not pickle it")

    def _api_key(self) -> str:
        return self.__key

    def _redact(self, text: str) -> str:
        key = self.__key
        return text.replace(key, "***") if key and key != "EMPTY" else text

    def _bind(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        """SDK client and semaphore for the running loop (both are loop-bound; rebuild per loop)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._sdk is None or self._semaphore is None:
            self._sdk = openai.AsyncOpenAI(
                api_key=self.__key, base_url=self.base_url, timeout=self.timeout, max_retries=0
            )
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
            self._loop = loop
        return self._sdk, self._semaphore

    async def aclose(self) -> None:
        """Close the connection pool of the current loop's SDK client."""
        if self._sdk is not None:
            await self._sdk.close()
            self._sdk, self._semaphore, self._loop = None, None, None

    def _permanent(self, what: str, model: str, status: int | None) -> ModelCallError:
        where = self.base_url or "api.openai.com"
        return ModelCallError(self._redact(f"{what} (model {model!r} at {where})"), status=status)

    async def _create_once(self, kwargs: dict[str, Any]) -> tuple[list[str], list[str]]:
        """One HTTP request; transient failures become `_TransientError`."""
        sdk, semaphore = self._bind()
        model = kwargs["model"]
        async with semaphore:
            self.calls += 1
            try:  # the raw reply: its body is read here, and judged by `_read_reply`
                raw = await sdk.chat.completions.with_raw_response.create(**kwargs)
            except openai.APIStatusError as exc:
                detail = f"HTTP {exc.status_code}: {exc.message}"
                if is_transient_status(exc.status_code):
                    retry_after = parse_retry_after(exc.response.headers)
                    raise _TransientError(detail, exc.status_code, retry_after) from None
                raise self._permanent(detail, model, exc.status_code) from None
            except openai.APIConnectionError as exc:  # includes APITimeoutError
                cause = exc.__cause__  # e.g. a body cut short: "peer closed connection ..."
                why = f" ({type(cause).__name__}: {cause})" if cause and str(cause) else ""
                raise _TransientError(f"{type(exc).__name__}: {exc}{why}", None) from None
            except openai.APIResponseValidationError as exc:  # a reply the SDK could not read
                detail = _unreadable_detail(exc.response, str(exc))
                raise _TransientError(detail, exc.status_code) from None
            except openai.APIError as exc:
                raise self._permanent(f"{type(exc).__name__}: {exc}", model, None) from None
        return self._read_reply(raw.http_response, model)

    def _read_reply(self, http_response: Any, model: str) -> tuple[list[str], list[str]]:
        """Texts and unusable-choice reasons of a 2xx reply; an unreadable body is transient.

        A proxy or overloaded server may answer 200 with non-UTF-8 bytes, an HTML error page,
        JSON cut short or JSON of another shape: like a 5xx, asking again usually works.
        """
        try:
            data = _decode_body(http_response.content)
            error = _embedded_error(data)
            if error is None:
                return _split_choices(data)
        except _UnreadableReply as exc:
            detail = _unreadable_detail(http_response, str(exc))
            raise _TransientError(detail, http_response.status_code) from None
        code = error.get("code")
        code = int(code) if isinstance(code, str) and code.isdigit() else code
        detail = f"provider error {code}: {error.get('message', '')}"
        if isinstance(code, int) and is_transient_status(code):
            raise _TransientError(detail, code)
        if code == 402:
            detail += " (insufficient credits)"
        raise self._permanent(detail, model, code if isinstance(code, int) else None)

    async def _create_with_retries(self, kwargs: dict[str, Any]) -> tuple[list[str], list[str]]:
        for attempt in range(self.max_retries + 1):
            try:
                return await self._create_once(kwargs)
            except _TransientError as exc:
                reason = self._redact(exc.reason)
                if attempt == self.max_retries:
                    raise ModelCallError(
                        f"gave up after {attempt + 1} attempts (model {kwargs['model']!r} at "
                        f"{self.base_url or 'api.openai.com'}): {reason}",
                        status=exc.status,
                        transient=True,
                    ) from None
                delay = self.retry_policy.delay(attempt, exc.retry_after)
                log.warning("model call failed (%s); retry %d in %.2fs", reason, attempt + 1, delay)
                self.retries += 1
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

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
            kwargs = _request_kwargs(messages, model, n - len(texts), sampling, seed)
            good, bad = await self._create_with_retries(kwargs)
            texts.extend(good)
            if bad or not good:
                reason = bad[0] if bad else "no choices returned"
                if invalid_left == 0:
                    raise self._permanent(f"unusable completion: {reason}", model, None)
                invalid_left -= 1
                self.retries += 1
                log.warning("unusable completion (%s); asking again", reason)
        return texts[:n]
