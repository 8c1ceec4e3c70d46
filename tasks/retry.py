"""Prefect retry policy for the stages that touch the network (model calls, fine-tune API).

A Prefect retry repeats a whole stage, so it is only worth it for failures that may go away on
their own (rate limits, 5xx answers, timeouts, dropped connections, and replies whose body could
not be read: non-UTF-8 bytes, a proxy's HTML page, JSON cut short). A bad configuration, a
corrupt artifact or a failed training job fails at once: retrying it would only waste minutes.

    @task(retries=2, retry_delay_seconds=[10, 60], retry_condition_fn=retry_transient_only)
"""

from __future__ import annotations

import json
import logging
from types import TracebackType
from typing import Any

import httpx
import openai

from nip_core.agents.clients import ModelCallError
from nip_core.artifacts import ArtifactError

log = logging.getLogger(__name__)

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
_PERMANENT_TYPES: tuple[type[BaseException], ...] = (ValueError, ArtifactError, TypeError, KeyError)
# Decoding errors (ValueErrors) that are transient when raised while reading an HTTP reply body
# inside these libraries; raised by our own code (a corrupt local file) they stay permanent.
_DECODE_ERRORS: tuple[type[BaseException], ...] = (UnicodeDecodeError, json.JSONDecodeError)
_HTTP_PACKAGES = frozenset({"openai", "httpx", "httpx2", "httpcore", "httpcore2", "aiohttp"})


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
    """True when `error` is a failure worth retrying the whole stage for.

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


def _state_exception(state: Any) -> BaseException | None:
    """The exception a failed Prefect state carries (None if it carries none)."""
    data = getattr(state, "data", None)
    if isinstance(data, BaseException):
        return data
    try:
        result = state.result(raise_on_failure=False)
    except Exception as e:  # a state whose result cannot be read: judge what was raised
        return e
    return result if isinstance(result, BaseException) else None


def retry_transient_only(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect `retry_condition_fn`: retry the task run only after a transient failure."""
    error = _state_exception(state)
    retry = error is not None and is_transient(error)
    name = getattr(task, "name", "task")
    if retry:
        log.warning("%s failed with a transient error, retrying: %r", name, error)
    else:
        log.info("%s failed with a permanent error, not retrying: %r", name, error)
    return retry
