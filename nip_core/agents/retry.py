"""The one retry policy of the pipeline: which failures are transient, and how long to wait.

Model calls (`DirectHttpChatClient`, `ReplicaChatClient`) and fine-tuning API calls
(`SharedModelGroup`) all retry in the one loop `RetryPolicy.call`, and Prefect task retries
(`tasks.TRANSIENT_RETRY`) ask the same `is_transient`: rate limits, 5xx answers, timeouts,
dropped connections and replies whose body could not be read (non-UTF-8 bytes, a proxy's HTML
page, JSON cut short) may go away on their own; a bad configuration, a corrupt artifact or a
failed training job fails at once: retrying it would only waste minutes.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import httpx
import openai

from nip_core.agents.chat_client import ModelCallError

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_RETRY_AFTER = 300.0  # never sleep longer than this on a server's Retry-After

# Network failures of the openai SDK and httpx that usually clear up on their own.
_TRANSIENT_TYPES: tuple[type[BaseException], ...] = (
    openai.RateLimitError,
    openai.APIConnectionError,  # includes APITimeoutError
    openai.InternalServerError,
    openai.APIResponseValidationError,  # a reply body the SDK could not read as its schema
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
    TimeoutError,
    ConnectionError,
)
# Never retried, even when a subclass also looks like a network error.
_PERMANENT_TYPES: tuple[type[BaseException], ...] = (ValueError, TypeError, KeyError)
# Decoding errors (ValueErrors) that are transient when raised while reading an HTTP reply body
# inside these libraries; raised by our own code (a corrupt local file) they stay permanent.
_DECODE_ERRORS: tuple[type[BaseException], ...] = (UnicodeDecodeError, json.JSONDecodeError)
_HTTP_PACKAGES = frozenset({"openai", "httpx", "httpx2", "httpcore", "httpcore2", "aiohttp"})


@dataclass
class RetryPolicy:
    """Exponential back-off with full jitter, `attempts` tries in all; a server's Retry-After
    (capped at `MAX_RETRY_AFTER`) replaces the jittered wait."""

    attempts: int = 7
    base_seconds: float = 0.5
    cap_seconds: float = 30.0
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_seconds < 0 or self.cap_seconds < 0:
            raise ValueError("attempts must be >= 1, base_seconds and cap_seconds >= 0")

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed try number `attempt` (0-based)."""
        if retry_after is not None and math.isfinite(retry_after):
            return min(max(retry_after, 0.0), MAX_RETRY_AFTER)
        ceiling = min(self.cap_seconds, self.base_seconds * 2.0**attempt)
        return self.rng.uniform(0.0, ceiling)

    async def call(
        self,
        what: str,
        make_call: Callable[[], Awaitable[T]],
        on_retry: Callable[[BaseException, int, float], None] | None = None,
    ) -> T:
        """`await make_call()`, tried again after each transient failure until tries run out;
        the last failure (or the first permanent one) is raised as it is.

        Each wait honours the failure's `retry_after` or its reply's Retry-After header.
        `on_retry(error, attempt, delay)` is told of each retry (default: a warning naming
        `what`).
        """
        for attempt in range(self.attempts):
            try:
                return await make_call()
            except Exception as error:
                if attempt == self.attempts - 1 or not is_transient(error):
                    raise
                delay = self.delay(attempt, _retry_after_of(error))
                if on_retry is None:
                    log.warning("%s: %s; retrying in %.1f s", what, type(error).__name__, delay)
                else:
                    on_retry(error, attempt, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")


def parse_retry_after(headers: Any) -> float | None:
    """Seconds to wait from `retry-after-ms` / `retry-after` (seconds or HTTP date), if any."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name) if headers is not None else None
        if value is None:
            continue
        try:
            return max(float(value) / scale, 0.0)
        except ValueError:
            pass
        try:
            return max(email.utils.parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
        except (TypeError, ValueError):
            continue
    return None


def _retry_after_of(error: BaseException) -> float | None:
    """The wait a failure asks for: its own `retry_after`, else its reply's headers."""
    wished = getattr(error, "retry_after", None)
    if isinstance(wished, (int, float)):
        return float(wished)
    response = getattr(error, "response", None)
    return parse_retry_after(getattr(response, "headers", None))


def is_transient_status(status: int) -> bool:
    """HTTP statuses worth retrying: timeouts, rate limits and server errors."""
    return status in (408, 429) or status >= 500


def _raised_in_http_client(traceback: TracebackType | None) -> bool:
    """Whether any frame of the traceback runs code of an HTTP client package."""
    while traceback is not None:
        module = traceback.tb_frame.f_globals.get("__name__") or ""
        if module.partition(".")[0] in _HTTP_PACKAGES:
            return True
        traceback = traceback.tb_next
    return False


def is_unreadable_reply(error: BaseException) -> bool:
    """A UnicodeDecodeError / JSONDecodeError from an HTTP client reading a garbled reply body."""
    return isinstance(error, _DECODE_ERRORS) and _raised_in_http_client(error.__traceback__)


def is_transient(error: BaseException) -> bool:
    """True when `error` is a failure worth trying again.

    A `ModelCallError` says itself (`.transient`); an exception group is transient only when
    every member is (one config error among timeouts must not be retried). A decoding error is
    transient when it escaped an HTTP client reading a reply (`is_unreadable_reply`).
    """
    if isinstance(error, BaseExceptionGroup):
        return all(is_transient(e) for e in error.exceptions)
    if isinstance(error, ModelCallError):
        return bool(error.transient)
    if is_unreadable_reply(error):
        return True
    if isinstance(error, _PERMANENT_TYPES):
        return False
    return isinstance(error, _TRANSIENT_TYPES)
