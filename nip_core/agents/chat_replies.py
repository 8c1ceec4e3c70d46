"""What an OpenAI-compatible chat request and reply look like: the request body, and the checks
that turn a reply into texts or into a transient or permanent failure.

Transient failures (429, 408, 5xx, timeouts, dropped connections and unreadable replies: a body
that is not UTF-8, not JSON, e.g. a proxy's HTML page, cut short, or JSON without a `choices`
list) raise `TransientCallError`, which the shared retry policy tries again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nip_core.agents.chat_client import ModelCallError, SamplingParams
from nip_core.agents.retry import is_transient_status

_BODY_SNIPPET_CHARS = 80  # how much of an unreadable reply body an error message quotes


class TransientCallError(ModelCallError):
    """One request failed in a way worth retrying after a pause (rate limit, 5xx, timeout,
    connection, unreadable reply); `retry_after` is the server's wish, if it said one."""

    def __init__(self, reason: str, status: int | None, retry_after: float | None = None):
        super().__init__(reason, status=status, transient=True)
        self.reason, self.retry_after = reason, retry_after


@dataclass(frozen=True)
class HttpReply:
    """An HTTP reply as the checks below read it: status, headers and the whole body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class UnreadableReply(Exception):
    """A 2xx reply whose body is not a chat completion (garbled, truncated, wrong shape)."""


def request_body(
    messages: list[dict], model: str, n: int, sampling: SamplingParams, seed: int | None
) -> dict[str, Any]:
    """The JSON body of a `/chat/completions` request, sending only what is set
    (`repetition_penalty` is an extension vLLM and our server read, `candidates` our server's)."""
    body: dict[str, Any] = {"model": model, "messages": messages, "n": n}
    optional = (("temperature", sampling.temperature), ("top_p", sampling.top_p))
    optional += (("max_tokens", sampling.max_tokens), ("seed", seed))
    optional += (("repetition_penalty", sampling.repetition_penalty),)
    candidates = list(sampling.candidates) if sampling.candidates is not None else None
    optional += (("candidates", candidates),)
    body.update({name: value for name, value in optional if value is not None})
    return body


def decode_body(body: bytes) -> dict:
    """The JSON object in a reply body (`UnreadableReply` naming what is wrong with it)."""
    if not body.strip():
        raise UnreadableReply("empty body")
    try:
        data = json.loads(body)  # bytes: UTF-8 (with or without BOM), or UTF-16/32
    except UnicodeDecodeError as exc:
        raise UnreadableReply(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        html = body.lstrip()[:1] == b"<"
        kind = "an HTML page, not JSON" if html else "not valid JSON (truncated or garbled)"
        raise UnreadableReply(f"{kind} ({exc.msg}, line {exc.lineno} column {exc.colno})") from None
    if not isinstance(data, dict):
        raise UnreadableReply(f"JSON {type(data).__name__}, not an object")
    return data


def embedded_error(data: dict) -> dict | None:
    """OpenRouter reports some failures inside a 200 body as `{"error": {"code", "message"}}`."""
    error = data.get("error")
    return error if isinstance(error, dict) else None


def _parse_choice(position: int, choice: Any) -> tuple[int, Any, Any]:
    """(index, finish_reason, content) of one choice; `UnreadableReply` when misshapen."""
    where = f"not a chat completion: choices[{position}]"
    if not isinstance(choice, dict):
        raise UnreadableReply(f"{where} is a {type(choice).__name__}, not an object")
    index = choice.get("index", position)
    if not isinstance(index, int) or isinstance(index, bool):
        raise UnreadableReply(f"{where}.index is {index!r}, not an int")
    message = choice.get("message")
    if message is not None and not isinstance(message, dict):
        raise UnreadableReply(f"{where}.message is a {type(message).__name__}, not an object")
    content = message.get("content") if message is not None else None
    if content is not None and not isinstance(content, str):
        raise UnreadableReply(f"{where}.message.content is a {type(content).__name__}")
    return index, choice.get("finish_reason"), content


def split_choices(data: dict) -> tuple[list[str], list[str]]:
    """(usable texts in choice-index order, reasons for unusable choices).

    A body that is not shaped like a chat completion raises `UnreadableReply`; an empty
    `choices` list, a filtered choice or one without content are well-formed but unusable.
    """
    choices = data.get("choices")
    if not isinstance(choices, list):
        what = "no 'choices'" if choices is None else f"'choices' is a {type(choices).__name__}"
        raise UnreadableReply(f"not a chat completion: {what}, expected a list")
    parsed = [_parse_choice(position, choice) for position, choice in enumerate(choices)]
    texts, bad = [], []
    for _, finish_reason, content in sorted(parsed, key=lambda c: c[0]):
        if finish_reason == "content_filter":
            bad.append("finish_reason 'content_filter'")
        elif content is None:
            bad.append(f"content is None (finish_reason {finish_reason!r})")
        else:
            texts.append(content)  # "length" is accepted: the truncated text is kept
    return texts, bad


def unreadable_detail(response: HttpReply, problem: str) -> str:
    """One line naming the status, content type, size and start of an unreadable reply."""
    body = response.content
    content_type = response.headers.get("content-type", "no content-type")
    snippet = body[:_BODY_SNIPPET_CHARS].decode("utf-8", "replace")
    more = "..." if len(body) > _BODY_SNIPPET_CHARS else ""
    return (
        f"unreadable reply (HTTP {response.status_code}, {content_type}, {len(body)} bytes):"
        f" {problem}; body starts {snippet!r}{more}"
    )


def openai_error_message(response: HttpReply) -> str:
    """The `error.message` of an OpenAI-shaped error body, else the start of the body."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]


class ProviderError(Exception):
    """A permanent failure the provider reported inside a 200 body (e.g. 402, no credits)."""

    def __init__(self, detail: str, status: int | None):
        super().__init__(detail)
        self.detail, self.status = detail, status


def read_reply(response: HttpReply) -> tuple[list[str], list[str]]:
    """A 2xx reply's (texts in choice order, reasons for unusable choices).

    An unreadable body raises `TransientCallError`: a proxy or overloaded server may answer 200
    with non-UTF-8 bytes, an HTML error page, JSON cut short or JSON of another shape, and like
    a 5xx, asking again usually works. An error embedded in the body is transient or permanent
    by its code (`ProviderError`).
    """
    try:
        data = decode_body(response.content)
        error = embedded_error(data)
        if error is None:
            return split_choices(data)
    except UnreadableReply as exc:
        detail = unreadable_detail(response, str(exc))
        raise TransientCallError(detail, response.status_code) from None
    code = error.get("code")
    code = int(code) if isinstance(code, str) and code.isdigit() else code
    detail = f"provider error {code}: {error.get('message', '')}"
    if isinstance(code, int) and is_transient_status(code):
        raise TransientCallError(detail, code)
    if code == 402:
        detail += " (insufficient credits)"
    raise ProviderError(detail, code if isinstance(code, int) else None)
