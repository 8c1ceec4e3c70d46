"""Chat-model clients: one async `ChatClient` interface for every model call in the pipeline.

`OpenAIChatClient` talks to any OpenAI-compatible endpoint (OpenAI, OpenRouter, a self-hosted vLLM
server) with our own retry policy, a concurrency bound and fewer-choices-than-`n` top-up.
`DummyChatClient` answers deterministically without a network, shaped like the verifier and
prover replies the protocols expect. `make_chat_client` picks one from an agent's parameters.

Unlike the reference, calls are async (many in flight at once, see nip §8.1), HTTP 429 is retried
(§8.21) and the dummy's randomness comes from a stable hash, never Python's salted `hash` (§8.18).

Transient failures (429, 408, 5xx, timeouts, dropped connections and unreadable replies: a body
that is not UTF-8, not JSON, e.g. a proxy's HTML page, cut short, or JSON without a `choices`
list) are retried with backoff; once retries run out they raise `ModelCallError(transient=True)`.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import logging
import math
import os
import random
import re
import string
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

import openai

log = logging.getLogger(__name__)

OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"
SELF_HOSTED_TOKEN_ENV = "NIP_LM_SERVER_TOKEN"
# Default seconds per request when an agent leaves `request_timeout_seconds` unset: a self-hosted
# CPU server answers a whole batched tree level at once, so it gets much longer than an API.
SELF_HOSTED_TIMEOUT = 900.0
HOSTED_API_TIMEOUT = 120.0
_BODY_SNIPPET_CHARS = 80  # how much of an unreadable reply body an error message quotes
_MAX_RETRY_AFTER = 300.0  # never sleep longer than this on a server's Retry-After
_INVALID_CHOICE_RETRIES = 3  # content-filtered / empty answers tolerated per `complete`


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one call; None means "leave it to the server"."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    repetition_penalty: float | None = None

    def __post_init__(self) -> None:
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.repetition_penalty is not None and self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


@runtime_checkable
class ChatClient(Protocol):
    """Anything that turns a chat prompt into `n` sampled replies."""

    async def complete(
        self, messages: list[dict], model: str, n: int, sampling: SamplingParams
    ) -> list[str]: ...


class ModelCallError(RuntimeError):
    """A model call failed for good: a non-transient error, or retries were exhausted.

    `status` is the HTTP (or provider) status code when there was one; `transient` says whether
    the last failure was of a retryable kind, so an outer layer may decide to try again later.
    """

    def __init__(self, message: str, *, status: int | None = None, transient: bool = False):
        super().__init__(message)
        self.status = status
        self.transient = transient


def request_digest(messages: list[dict], model: str, n: int, sampling: SamplingParams) -> str:
    """Stable sha256 of everything a call's answer depends on (same across processes)."""
    payload = {"messages": messages, "model": model, "n": n, "sampling": asdict(sampling)}
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


class _TransientError(Exception):
    """A failure worth retrying after a pause (rate limit, 5xx, timeout, connection)."""

    def __init__(self, reason: str, status: int | None, retry_after: float | None = None):
        super().__init__(reason)
        self.reason, self.status, self.retry_after = reason, status, retry_after


def _parse_retry_after(headers: Any) -> float | None:
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


def _is_transient_status(status: int) -> bool:
    return status in (408, 429) or status >= 500


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
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.__key = self._read_key(api_key_env)
        self.calls = 0
        self.retries = 0
        self._jitter = random.Random()
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

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Server's Retry-After if given, else full jitter on an exponential ceiling."""
        if retry_after is not None and math.isfinite(retry_after):
            return min(retry_after, _MAX_RETRY_AFTER)
        ceiling = min(self.backoff_max, self.backoff_base * 2.0**attempt)
        return self._jitter.uniform(0.0, ceiling)

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
                if _is_transient_status(exc.status_code):
                    retry_after = _parse_retry_after(exc.response.headers)
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
        if isinstance(code, int) and _is_transient_status(code):
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
                delay = self._backoff(attempt, exc.retry_after)
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


_DECISION_RE = re.compile(r"decision:\s*accept", re.IGNORECASE)
_REJECT_RE = re.compile(r"decision:\s*reject", re.IGNORECASE)
_HEADER_RE = re.compile(r"Question for ([A-Za-z0-9_]+):")
_MUST_DECIDE_RE = re.compile(  # nip's, our protocols' and the supervisor's "decide now" notes
    r"\bmust\b[^.\n]*\bdeci(?:de|sion)\b|\bno (?:more )?questions? (?:left|remaining)\b"
    r"|\bcannot ask any more questions\b|\bnow with your (?:decision|verdict)\b",
    re.IGNORECASE,
)


def _is_verifier_prompt(system: str) -> bool:
    """The verifier prompt is the one that tells the model how to write both decisions."""
    return bool(_DECISION_RE.search(system) and _REJECT_RE.search(system))


def _question_headers(system: str) -> list[str]:
    """Distinct "Question for <Name>:" headers named by the system prompt, in order."""
    return list(dict.fromkeys(f"Question for {name}:" for name in _HEADER_RE.findall(system)))


def _must_decide_now(messages: list[dict]) -> bool:
    """True when the trailing message is a system (or supervisor) note forcing a decision."""
    last = messages[-1]
    forced_role = last.get("role") == "system" or last.get("name") == "Supervisor"
    return len(messages) > 1 and forced_role and bool(_MUST_DECIDE_RE.search(last["content"]))


def _words(rng: random.Random, count: int = 6) -> str:
    words = [
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 8))) for _ in range(count)
    ]
    return " ".join(words).capitalize()


def _verifier_reply(rng: random.Random, headers: list[str], forced: bool, p_invalid: float) -> str:
    if forced:
        return "Decision: accept" if rng.random() < 0.5 else "Decision: reject"
    if rng.random() < p_invalid:
        if len(headers) > 1:  # a question that misses one of the required headers
            return f"{headers[0]} {_words(rng)}?"
        return "Decision: maybe"
    u = rng.random()
    if u < 0.2:
        return "Decision: accept"
    if u < 0.4:
        return "Decision: reject"
    lines = [f"{header} {_words(rng)}?" for header in headers] or [f"Question: {_words(rng)}?"]
    return "\n".join(lines)


async def close_clients(clients: Iterable[Any]) -> None:
    """Close the connection pools of `clients` (each once) in the running event loop.

    An SDK client left open when `asyncio.run` returns is closed later by the garbage collector,
    on a loop that no longer exists, which logs "Event loop is closed" tracebacks.
    """
    unique = {id(c): c for c in clients}.values()
    await asyncio.gather(*(c.aclose() for c in unique if hasattr(c, "aclose")))


class DummyChatClient:
    """Offline `ChatClient` whose replies depend only on (seed, sampling.seed, messages, index).

    Verifier prompts get a decision (1/5 accept, 1/5 reject) or a question, one line per
    "Question for <Name>:" header; other prompts get "Answer: ...". A fraction
    `invalid_probability` of verifier replies is malformed so retry paths run; a trailing
    "you must decide" system message always gets a valid decision. Provers are always valid.
    """

    def __init__(
        self, seed: int = 0, *, latency: float = 0.0, invalid_probability: float = 0.1
    ) -> None:
        if latency < 0:
            raise ValueError(f"latency must be >= 0, got {latency}")
        if not 0.0 <= invalid_probability <= 1.0:
            raise ValueError(f"invalid_probability must be in [0, 1], got {invalid_probability}")
        self.seed, self.latency, self.invalid_probability = seed, latency, invalid_probability
        self.calls = 0
        self.call_keys: list[str] = []
        self.call_log: str | None = None

    def _rng(self, messages: list[dict], sampling: SamplingParams, index: int) -> random.Random:
        convo = [[m["role"], m["content"], m.get("name")] for m in messages]
        blob = json.dumps([self.seed, sampling.seed, convo, index], ensure_ascii=False).encode()
        return random.Random(int.from_bytes(hashlib.sha256(blob).digest(), "big"))

    def reply(self, messages: list[dict], sampling: SamplingParams, index: int) -> str:
        """The `index`-th sampled reply to `messages` (pure; no counters touched)."""
        rng = self._rng(messages, sampling, index)
        system = messages[0]["content"] if messages[0].get("role") == "system" else ""
        if not _is_verifier_prompt(system):
            return f"Answer: {_words(rng)}."
        headers = _question_headers(system)
        forced = _must_decide_now(messages)
        return _verifier_reply(rng, headers, forced, self.invalid_probability)

    async def complete(
        self, messages: list[dict], model: str, n: int, sampling: SamplingParams
    ) -> list[str]:
        check_request(messages, model, n, sampling)
        if self.latency:
            await asyncio.sleep(self.latency)
        texts = [self.reply(messages, sampling, i) for i in range(n)]
        self.calls += 1
        key = request_digest(messages, model, n, sampling)
        self.call_keys.append(key)
        if self.call_log is not None:  # cross-process record, for resume tests
            with open(self.call_log, "a", encoding="utf-8") as f:
                f.write(key + "\n")
        return texts


def _param(agent_params: Any, name: str, default: Any = None) -> Any:
    """Read a field from a parameters object or a plain mapping."""
    if isinstance(agent_params, Mapping):
        return agent_params.get(name, default)
    return getattr(agent_params, name, default)


def request_timeout(agent_params: Any) -> float:
    """Seconds one model request of this agent may take before it counts as timed out.

    The agent's `request_timeout_seconds` when set, else `SELF_HOSTED_TIMEOUT` (900 s) for
    `model_provider="SelfHosted"` and `HOSTED_API_TIMEOUT` (120 s) for OpenAI and OpenRouter.
    """
    value = _param(agent_params, "request_timeout_seconds", None)
    if value is None:
        self_hosted = _param(agent_params, "model_provider", "OpenAI") == "SelfHosted"
        return SELF_HOSTED_TIMEOUT if self_hosted else HOSTED_API_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"request_timeout_seconds must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"request_timeout_seconds must be > 0 and finite, got {value!r}")
    return float(value)


def make_chat_client(
    agent_params: Any, *, max_concurrency: int = 32, dummy_seed: int = 0
) -> ChatClient:
    """Build the client an agent's parameters ask for.

    Reads `use_dummy_api`, `model_provider` ("OpenAI" | "OpenRouter" | "SelfHosted"),
    `request_timeout_seconds` (see `request_timeout`) and, for self-hosting,
    `language_model_server_scheme_host` / `language_model_server_port`. Callers cache clients
    per (base_url, key env); this function always builds a new one.
    """
    if _param(agent_params, "use_dummy_api", False):
        # Test knobs: a simulated latency and a call log shared across processes.
        client = DummyChatClient(
            dummy_seed, latency=float(os.environ.get("NIP_DUMMY_LATENCY", "0") or 0)
        )
        client.call_log = os.environ.get("NIP_DUMMY_CALL_LOG") or None
        return client
    base_url, key_env = api_endpoint(agent_params)
    timeout = request_timeout(agent_params)
    return OpenAIChatClient(base_url, key_env, max_concurrency=max_concurrency, timeout=timeout)


def api_endpoint(agent_params: Any) -> tuple[str | None, str | None]:
    """(base URL, env var holding the API key) of an agent's provider; None key = no key."""
    provider = _param(agent_params, "model_provider", "OpenAI")
    if provider == "OpenAI":
        return None, "OPENAI_API_KEY"
    if provider == "OpenRouter":
        return OPENROUTER_BASE_URL, "OPENROUTER_API_KEY"
    if provider == "SelfHosted":
        host = _param(agent_params, "language_model_server_scheme_host", "http://localhost")
        port = _param(agent_params, "language_model_server_port", 5000)
        key_env = SELF_HOSTED_TOKEN_ENV if os.environ.get(SELF_HOSTED_TOKEN_ENV) else None
        return f"{str(host).rstrip('/')}:{port}/v1", key_env
    raise ValueError(
        f"unknown model_provider {provider!r}; expected 'OpenAI', 'OpenRouter' or 'SelfHosted'"
    )
