"""The one async interface every model call in the pipeline goes through, and its request types.

Unlike the reference, calls are async (many in flight at once, see nip §8.1).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one call; None means "leave it to the server"."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    # The texts the reply must be one of, drawn by the model's score of each (our server's
    # extension, `nip_core.lm_server.candidates`); None: a free reply.
    candidates: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.repetition_penalty is not None and self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.candidates is not None and (
            len(self.candidates) < 2 or len(set(self.candidates)) != len(self.candidates)
        ):
            raise ValueError(f"candidates must be 2 or more distinct texts, got {self.candidates}")


@runtime_checkable
class ChatClient(Protocol):
    """Anything that turns a chat prompt into `n` sampled replies."""

    async def complete(
        self, messages: list[dict], model: str, n: int, sampling: SamplingParams
    ) -> list[str]: ...


class ModelCallError(RuntimeError):
    """A model call failed for good: a non-transient error, or retries were exhausted.

    `status` is the HTTP (or provider) status code when there was one; `transient` says whether
    the last failure was of a retryable kind, so an outer layer may decide to try again later;
    `unreachable_url` names the endpoint when the last try got no answer at all.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        transient: bool = False,
        unreachable_url: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.transient = transient
        self.unreachable_url = unreachable_url  # the endpoint no try could reach, if that was it


class EndpointUnreachableError(ConnectionError):
    """A model server the run depends on does not answer at all: `url` names it. The commands
    report it as one `error:` line with exit code 3 (`flows.cli.run_command`)."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(message)
        self.url = url


def sampling_key_fields(sampling: Any) -> dict:
    """A call's sampling settings (a dataclass) as call keys hash them: `candidates` only where
    set, so the keys of free replies are what they were before that field existed."""
    fields = asdict(sampling)
    if fields.get("candidates", ()) is None:
        del fields["candidates"]
    return fields


def request_digest(messages: list[dict], model: str, n: int, sampling: SamplingParams) -> str:
    """Stable sha256 of everything a call's answer depends on (same across processes)."""
    payload = {
        "messages": messages,
        "model": model,
        "n": n,
        "sampling": sampling_key_fields(sampling),
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()


def check_request(messages: list[dict], model: str, n: int, sampling: SamplingParams) -> None:
    """Reject malformed calls early with an error naming the problem."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} dicts")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content'")
        if not isinstance(message["content"], str):
            raise ValueError(f"messages[{i}]['content'] must be a string")
    if not isinstance(model, str) or not model:
        raise ValueError("model must be a non-empty string")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if not isinstance(sampling, SamplingParams):
        raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")


async def close_clients(clients: Iterable[Any]) -> None:
    """Close the connection pools of `clients` (each once) in the running event loop.

    An SDK client left open when `asyncio.run` returns is closed later by the garbage collector,
    on a loop that no longer exists, which logs "Event loop is closed" tracebacks.
    """
    unique = {id(c): c for c in clients}.values()
    await asyncio.gather(*(c.aclose() for c in unique if hasattr(c, "aclose")))
