"""Tests for nip_core.agents.clients: the chat client against real HTTP on 127.0.0.1, the factory.

The dummy client is tested in test_clients_dummy.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import gc
import json
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aiohttp
import pytest

from nip_core.agents.clients import (
    HOSTED_API_TIMEOUT,
    SELF_HOSTED_TIMEOUT,
    ChatClient,
    DirectHttpChatClient,
    DummyChatClient,
    ModelCallError,
    SamplingParams,
    _parse_retry_after,
    close_clients,
    make_chat_client,
    request_timeout,
)
from nip_core.agents.http_client import env_proxy
from nip_core.agents.retry import is_transient
from nip_core.parameters import PureTextAgentParameters

SECRET = "sk-test-PLANTED-SECRET-0123456789"
KEY_ENV = "NIP_TEST_CLIENT_KEY"
MSGS = [
    {"role": "system", "content": "You are an expert."},
    {"role": "user", "content": "Is it right?", "name": "Verifier"},
]


def completion_body(texts: list[str], finish: str = "stop") -> dict:
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": t},
            "finish_reason": finish,
        }
        for i, t in enumerate(texts)
    ]
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": choices,
    }


@dataclass(frozen=True)
class Raw:
    """A reply body sent byte for byte; `declared_length` may lie (body cut short), `drop`
    closes the connection without answering."""

    body: bytes = b""
    content_type: str = "application/json"
    declared_length: int | None = None
    drop: bool = False


Reply = tuple[int, dict[str, str], "dict | Raw"]  # status, headers, JSON body (or raw bytes)
Script = Callable[[int, dict, Any], Reply]  # request index, JSON body, headers


@dataclass
class FakeServer:
    """What the server saw; `script(request_index, body, headers)` decides each reply."""

    url: str
    script: Script
    delay: float = 0.0
    bodies: list[dict] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    active: int = 0
    max_active: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def ok_with_n(_i: int, body: dict, _h: dict[str, str]) -> Reply:
    n = body.get("n", 1)
    return 200, {}, completion_body([f"text {k} of {n}" for k in range(n)])


@contextlib.contextmanager
def fake_server(protocol_version: str) -> Iterator[FakeServer]:
    state = FakeServer(url="", script=ok_with_n)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                index = len(state.bodies)
                state.bodies.append(body)
                state.auth.append(self.headers.get("Authorization", ""))
                state.headers.append(dict(self.headers))
                state.paths.append(self.path)
                state.active += 1
                state.max_active = max(state.max_active, state.active)
            # The request stops counting as active before any byte of its reply is sent: once
            # the client has the reply it may start the next request, possibly before this
            # thread runs again, so counting until after the write overstates concurrency.
            try:
                time.sleep(state.delay)
                status, headers, reply = state.script(index, body, self.headers)
            finally:
                with state.lock:
                    state.active -= 1
            raw = reply if isinstance(reply, Raw) else Raw(json.dumps(reply).encode())
            if raw.drop or raw.declared_length is not None:
                self.close_connection = True
            if raw.drop:
                return
            payload = raw.body
            self.send_response(status)
            self.send_header("Content-Type", raw.content_type)
            self.send_header("Content-Length", str(raw.declared_length or len(payload)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    Handler.protocol_version = protocol_version
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with fake_server("HTTP/1.0") as state:
        yield state


@pytest.fixture
def key_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, SECRET)
    return KEY_ENV


def fast_client(url: str, key: str | None, **kw: object) -> DirectHttpChatClient:
    settings = {"max_retries": 3, "backoff_base": 0.001, "backoff_max": 0.01, "timeout": 5.0}
    settings.update(kw)
    return DirectHttpChatClient(url, key, **settings)  # type: ignore[arg-type]


def error(status: int, message: str = "nope", headers: dict | None = None) -> Reply:
    return status, headers or {}, {"error": {"message": message, "type": "x", "code": status}}


# ---------------------------------------------------------------- DirectHttpChatClient over HTTP


def test_rate_limit_is_retried_honouring_retry_after(server: FakeServer, key_env: str) -> None:
    server.script = lambda i, b, h: (
        error(429, headers={"Retry-After": "0"}) if i < 2 else ok_with_n(i, b, h)
    )
    client = fast_client(server.url, key_env, backoff_base=5.0, backoff_max=5.0)
    start = time.perf_counter()
    texts = asyncio.run(client.complete(MSGS, "m", 1, SamplingParams()))
    assert texts == ["text 0 of 1"]
    assert (client.retries, client.calls, len(server.bodies)) == (2, 3, 3)
    assert time.perf_counter() - start < 2.0  # Retry-After 0 beat the 5 s backoff


def test_server_errors_exhaust_retries(server: FakeServer, key_env: str) -> None:
    server.script = lambda i, b, h: error(500, "boom")
    client = fast_client(server.url, key_env, max_retries=4)
    with pytest.raises(ModelCallError, match="500") as info:
        asyncio.run(client.complete(MSGS, "m", 1, SamplingParams()))
    assert info.value.transient and info.value.status == 500
    assert client.retries == 4 and len(server.bodies) == 5


def test_bad_request_fails_at_once(server: FakeServer, key_env: str) -> None:
    server.script = lambda i, b, h: error(400, "model does not exist")
    client = fast_client(server.url, key_env)
    with pytest.raises(ModelCallError, match=r"400.*model does not exist") as info:
        asyncio.run(client.complete(MSGS, "m", 1, SamplingParams()))
    assert not info.value.transient
    assert client.retries == 0 and len(server.bodies) == 1


def test_timeout_and_connection_errors_are_transient(server: FakeServer, key_env: str) -> None:
    server.delay = 0.5
    client = fast_client(server.url, key_env, timeout=0.1, max_retries=1)
    with pytest.raises(ModelCallError, match="Timeout") as info:
        asyncio.run(client.complete(MSGS, "m", 1, SamplingParams()))
    assert info.value.transient and client.retries == 1
    dead = fast_client("http://127.0.0.1:9/v1", key_env, max_retries=2)
    with pytest.raises(ModelCallError, match="Connect"):
        asyncio.run(dead.complete(MSGS, "m", 1, SamplingParams()))
    assert dead.retries == 2 and dead.calls == 3


def test_n_texts_and_request_fields(server: FakeServer, key_env: str) -> None:
    client = fast_client(server.url, key_env)
    sampling = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=50, seed=3)
    texts = asyncio.run(client.complete(MSGS, "my-model", 3, sampling))
    assert texts == ["text 0 of 3", "text 1 of 3", "text 2 of 3"]
    body = server.bodies[0]
    assert body["messages"] == MSGS  # "name" passed through
    assert (body["model"], body["n"], body["temperature"], body["top_p"]) == (
        "my-model",
        3,
        0.7,
        0.9,
    )
    assert (body["max_tokens"], body["seed"]) == (50, 3)
    assert "repetition_penalty" not in body
    asyncio.run(client.complete(MSGS, "m", 1, SamplingParams(repetition_penalty=1.1)))
    assert server.bodies[1]["repetition_penalty"] == 1.1
    assert "temperature" not in server.bodies[1]


def test_choices_are_returned_in_index_order(server: FakeServer, key_env: str) -> None:
    def shuffled(i: int, b: dict, h: dict[str, str]) -> Reply:
        body = completion_body(["a", "b", "c"], finish="length")
        body["choices"].reverse()
        return 200, {}, body

    server.script = shuffled
    client = fast_client(server.url, key_env)
    assert asyncio.run(client.complete(MSGS, "m", 3, SamplingParams())) == ["a", "b", "c"]


def test_fewer_choices_than_n_are_topped_up(server: FakeServer, key_env: str) -> None:
    server.script = lambda i, b, h: (200, {}, completion_body([f"t{i}"]))  # ignores n
    client = fast_client(server.url, key_env)
    texts = asyncio.run(client.complete(MSGS, "m", 3, SamplingParams(seed=10)))
    assert texts == ["t0", "t1", "t2"]
    assert [b["n"] for b in server.bodies] == [3, 2, 1]
    assert [b["seed"] for b in server.bodies] == [10, 11, 12]  # distinct seeds for top-ups
    assert client.retries == 0


def test_content_filter_retried_then_fails(server: FakeServer, key_env: str) -> None:
    server.script = lambda i, b, h: (
        (200, {}, completion_body(["x"], finish="content_filter")) if i < 2 else ok_with_n(i, b, h)
    )
    client = fast_client(server.url, key_env)
    assert asyncio.run(client.complete(MSGS, "m", 1, SamplingParams())) == ["text 0 of 1"]
    assert client.retries == 2
    server.script = lambda i, b, h: (200, {}, completion_body([None]))  # type: ignore[list-item]
    with pytest.raises(ModelCallError, match="content is None"):
        asyncio.run(client.complete(MSGS, "m", 1, SamplingParams()))


def test_openrouter_embedded_errors(server: FakeServer, key_env: str) -> None:
    embedded = {"error": {"code": 429, "message": "slow down"}}
    server.script = lambda i, b, h: (200, {}, embedded) if i == 0 else ok_with_n(i, b, h)
    client = fast_client(server.url, key_env)
    assert asyncio.run(client.complete(MSGS, "m", 1, SamplingParams())) == ["text 0 of 1"]
    assert client.retries == 1
    server.script = lambda i, b, h: (200, {}, {"error": {"code": 402, "message": "pay"}})
    with pytest.raises(ModelCallError, match="insufficient credits"):
        asyncio.run(client.complete(MSGS, "m", 1, SamplingParams()))


GOOD_BODY = json.dumps(completion_body(["fine"])).encode()
# Replies a proxy or an overloaded server sends with status 200, and the error each one gives.
GARBAGE: dict[str, tuple[dict | Raw, str]] = {
    "non-utf8": (Raw(b'{"choices": [{"message": {"content": "caf\xe9"}}]}'), "not UTF-8"),
    "html": (
        Raw(b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html"),
        r"text/html.*an HTML page, not JSON.*body starts '<html><body><h1>502",
    ),
    "truncated-json": (Raw(GOOD_BODY[:40]), "not valid JSON"),
    "empty": (Raw(b""), "empty body"),
    "json-list": (Raw(b"[1, 2]"), "JSON list, not an object"),
    "no-choices": ({"id": "cmpl-1", "object": "chat.completion"}, "no 'choices'"),
    "choices-not-list": ({"choices": "oops"}, "'choices' is a str"),
    "choice-not-object": ({"choices": ["text"]}, r"choices\[0\] is a str"),
    "content-not-string": (
        {"choices": [{"index": 0, "message": {"content": {"x": 1}}, "finish_reason": "stop"}]},
        r"choices\[0\]\.message\.content is a dict",
    ),
    "cut-short": (
        Raw(GOOD_BODY, declared_length=len(GOOD_BODY) + 100),
        "(APIConnectionError|RemoteProtocolError).*peer closed connection without sending "
        "complete message body|ClientPayloadError: Response payload is not completed",
    ),
    "hang-up": (
        Raw(drop=True),
        "(APIConnectionError|RemoteProtocolError).*disconnected without sending a response"
        "|ServerDisconnectedError: Server disconnected",
    ),
}


def test_unreadable_replies_are_retried_until_a_good_one(
    server: FakeServer, key_env: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each kind of garbage once (one request each, in order), then a valid completion."""
    garbage = [reply for reply, _ in GARBAGE.values()]
    server.script = lambda i, b, h: (
        (200, {}, garbage[i]) if i < len(garbage) else ok_with_n(i, b, h)
    )
    client = fast_client(server.url, key_env, max_retries=len(garbage))
    with caplog.at_level(logging.WARNING, logger="nip_core.agents.clients"):
        texts = asyncio.run(client.complete(MSGS, "m", 1, SamplingParams()))
    assert texts == ["text 0 of 1"]
    assert client.retries == len(garbage) and len(server.bodies) == len(garbage) + 1
    unreadable = [r for r in caplog.records if "unreadable reply (HTTP 200" in r.getMessage()]
    assert len(unreadable) == len(garbage) - 2  # the cut-short and hung-up ones: connection errors


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_unreadable_reply_every_time_fails_transient_with_a_clear_error(
    kind: str, server: FakeServer, key_env: str
) -> None:
    reply, message = GARBAGE[kind]
    server.script = lambda i, b, h: (200, {}, reply)
    client = fast_client(server.url, key_env, max_retries=2)
    with pytest.raises(ModelCallError, match=message) as info:
        asyncio.run(client.complete(MSGS, "m", 1, SamplingParams()))
    assert str(info.value).startswith("gave up after 3 attempts (model 'm' at http://127.0.0.1:")
    assert "\n" not in str(info.value)
    assert info.value.transient and is_transient(info.value)  # a Prefect retry may try again
    assert len(server.bodies) == 3 and client.retries == 2


def test_empty_choices_are_still_asked_again_not_backed_off(
    server: FakeServer, key_env: str
) -> None:
    """A well-formed reply with no usable choice is an unusable answer, as before."""
    server.script = lambda i, b, h: (200, {}, completion_body([]))
    client = fast_client(server.url, key_env, max_retries=0)
    with pytest.raises(ModelCallError, match="no choices returned") as info:
        asyncio.run(client.complete(MSGS, "m", 1, SamplingParams()))
    assert not info.value.transient and len(server.bodies) == 4


def test_concurrency_is_bounded(server: FakeServer, key_env: str) -> None:
    server.delay = 0.1
    client = fast_client(server.url, key_env, max_concurrency=3)

    async def many() -> list[list[str]]:
        calls = [client.complete(MSGS, "m", 1, SamplingParams()) for _ in range(10)]
        return await asyncio.gather(*calls)

    assert len(asyncio.run(many())) == 10
    assert server.max_active == 3 and client.calls == 10


def test_secret_never_leaks(
    server: FakeServer, key_env: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A hostile server echoes the Authorization header back, first as 503 (retried), then 401.
    def echo(i: int, b: dict, h: dict[str, str]) -> Reply:
        return error(503 if i == 0 else 401, f"bad key {h.get('Authorization')}")

    server.script = echo
    client = fast_client(server.url, key_env)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ModelCallError) as info:
        asyncio.run(client.complete(MSGS, "m", 1, SamplingParams()))
    assert server.auth == [f"Bearer {SECRET}"] * 2  # the key did reach the server
    assert "401" in str(info.value) and "***" in str(info.value)
    shown = "".join(traceback.format_exception(info.value))
    for text in (repr(client), str(client), str(info.value), repr(info.value), shown, caplog.text):
        assert SECRET not in text


def test_missing_key_env_and_bad_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NIP_TEST_ABSENT_KEY", raising=False)
    with pytest.raises(ValueError, match="NIP_TEST_ABSENT_KEY"):
        DirectHttpChatClient(None, "NIP_TEST_ABSENT_KEY")
    client = DirectHttpChatClient("http://127.0.0.1:9/v1", None)
    with pytest.raises(ValueError, match="n must be"):
        asyncio.run(client.complete(MSGS, "m", 0, SamplingParams()))
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        asyncio.run(client.complete([{"content": "x"}], "m", 1, SamplingParams()))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)


def test_client_survives_a_new_event_loop(server: FakeServer, key_env: str) -> None:
    client = fast_client(server.url, key_env, max_concurrency=2)
    for _ in range(2):  # asyncio.run twice: connection pools and semaphore are rebound
        assert asyncio.run(client.complete(MSGS, "m", 1, SamplingParams())) == ["text 0 of 1"]


@pytest.mark.parametrize("closed", [False, True])
def test_clients_closed_in_their_loop_leave_no_tracebacks_later(
    closed: bool, key_env: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A client collected while a later loop runs logs no "Event loop is closed" traceback,
    closed in its loop or not (the SDK's client, left open, did); closing empties its pools."""
    with fake_server("HTTP/1.1") as keep_alive:  # a pooled connection stays open
        client = DirectHttpChatClient(keep_alive.url, key_env, timeout=5.0)

        async def use() -> None:
            await client.complete(MSGS, "m", 1, SamplingParams())
            if closed:
                await close_clients([client, client])  # duplicates are closed once
                assert client._session is None

        asyncio.run(use())

        async def later_stage() -> None:
            nonlocal client
            del client
            gc.collect()
            await asyncio.sleep(0.05)

        with caplog.at_level(logging.ERROR, logger="asyncio"):
            asyncio.run(later_stage())
            gc.collect()
    logged = "\n".join(r.getMessage() + str(r.exc_info) for r in caplog.records)
    assert "Event loop is closed" not in logged


def test_retry_after_forms() -> None:
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < _parse_retry_after({"retry-after": future}) <= 30
    assert _parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert _parse_retry_after({"retry-after": "2"}) == 2.0
    assert _parse_retry_after({"retry-after": "soon"}) is None
    assert _parse_retry_after({}) is None


# ---------------------------------------------------------------- make_chat_client


def test_factory_picks_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("OPENROUTER_API_KEY", SECRET)
    monkeypatch.delenv("NIP_LM_SERVER_TOKEN", raising=False)
    assert isinstance(make_chat_client({"use_dummy_api": True}, dummy_seed=4), DummyChatClient)
    openai_client = make_chat_client({"model_provider": "OpenAI"})
    assert (openai_client.base_url, openai_client.api_key_env) == (None, "OPENAI_API_KEY")
    router = make_chat_client({"model_provider": "OpenRouter"}, max_concurrency=5)
    assert router.base_url == "https://openrouter.ai/api/v1" and router.max_concurrency == 5

    @dataclass
    class Params:
        model_provider: str = "SelfHosted"
        language_model_server_scheme_host: str = "http://gpu-box"
        language_model_server_port: int = 5001
        use_dummy_api: bool = False

    local = make_chat_client(Params())
    assert (local.base_url, local.api_key_env) == ("http://gpu-box:5001/v1", None)
    monkeypatch.setenv("NIP_LM_SERVER_TOKEN", "tok")
    assert make_chat_client(Params()).api_key_env == "NIP_LM_SERVER_TOKEN"
    with pytest.raises(ValueError, match="Anthropic"):
        make_chat_client({"model_provider": "Anthropic"})
    assert all(isinstance(c, ChatClient) for c in (openai_client, router, local))


def test_hosted_providers_chat_over_the_direct_client_with_the_sdks_headers(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenAI (and OpenRouter) chat goes through `DirectHttpChatClient` like our server's: to
    $OPENAI_BASE_URL when set, with the key and the account headers the SDK would send."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_ORG_ID", "org-1")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-1")
    client = make_chat_client({"model_provider": "OpenAI"})
    assert isinstance(client, DirectHttpChatClient) and client.url == server.url
    assert asyncio.run(client.complete(MSGS, "gpt-x", 2, SamplingParams())) == [
        "text 0 of 2",
        "text 1 of 2",
    ]
    headers = {k.lower(): v for k, v in server.headers[0].items()}
    assert headers["authorization"] == f"Bearer {SECRET}"
    assert (headers["openai-organization"], headers["openai-project"]) == ("org-1", "proj-1")
    assert headers["content-type"] == "application/json"
    assert server.paths == ["/v1/chat/completions"]
    monkeypatch.delenv("OPENAI_BASE_URL")
    assert make_chat_client({"model_provider": "OpenAI"}).url == "https://api.openai.com/v1"
    monkeypatch.setenv("OPENROUTER_API_KEY", SECRET)
    router = make_chat_client({"model_provider": "OpenRouter"})
    assert isinstance(router, DirectHttpChatClient)
    assert router.url == "https://openrouter.ai/api/v1"


def test_request_timeout_is_an_agent_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("OPENROUTER_API_KEY", SECRET)
    monkeypatch.delenv("NIP_LM_SERVER_TOKEN", raising=False)
    self_hosted = PureTextAgentParameters(model_provider="SelfHosted")
    assert make_chat_client(self_hosted).timeout == SELF_HOSTED_TIMEOUT == 900.0
    assert make_chat_client(PureTextAgentParameters()).timeout == HOSTED_API_TIMEOUT == 120.0
    assert make_chat_client({"model_provider": "OpenRouter"}).timeout == HOSTED_API_TIMEOUT
    for provider in ("SelfHosted", "OpenAI"):
        params = PureTextAgentParameters(model_provider=provider, request_timeout_seconds=30)
        client = make_chat_client(params)
        assert client.timeout == 30.0 and request_timeout(params) == 30.0

        async def pool_timeout(client: DirectHttpChatClient = client) -> object:
            session, _ = client._bind_loop()
            timeout = session.timeout
            await client.aclose()
            return timeout

        # what the pool is built with: each phase, as httpx's Timeout(30.0)
        per_phase = aiohttp.ClientTimeout(
            total=None, connect=30.0, sock_connect=30.0, sock_read=30.0
        )
        assert asyncio.run(pool_timeout()) == per_phase
    assert request_timeout({"model_provider": "SelfHosted", "request_timeout_seconds": 2.5}) == 2.5
    for bad in (0, -1.0, float("inf"), "30", True):
        with pytest.raises(ValueError, match="request_timeout_seconds"):
            request_timeout({"request_timeout_seconds": bad})
    with pytest.raises(ValueError, match="request_timeout_seconds: must be > 0"):
        PureTextAgentParameters(request_timeout_seconds=0)


def test_request_timeout_setting_times_out_a_slow_server(server: FakeServer, key_env: str) -> None:
    server.delay = 1.0
    params = {"model_provider": "SelfHosted", "request_timeout_seconds": 0.2}
    client = DirectHttpChatClient(
        server.url, key_env, timeout=request_timeout(params), max_retries=0, backoff_base=0.0
    )
    start = time.perf_counter()
    with pytest.raises(ModelCallError, match="Timeout"):
        asyncio.run(client.complete(MSGS, "m", 1, SamplingParams()))
    assert time.perf_counter() - start < 0.9
    deadline = time.monotonic() + 5  # let the server finish its late answer inside this test
    while server.active and time.monotonic() < deadline:
        time.sleep(0.05)


def test_the_proxy_comes_from_the_environment_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the SDK's client: HTTPS_PROXY / HTTP_PROXY for the endpoint's scheme, NO_PROXY exempts,
    credentials in the proxy URL go as proxy auth (read when the pool is built, not per call)."""
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    assert env_proxy("https://api.openai.com/v1") == (None, None)
    monkeypatch.setenv("HTTPS_PROXY", "http://user:pw@proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    proxy, auth = env_proxy("https://api.openai.com/v1")
    assert proxy == "http://proxy.example:3128" and (auth.login, auth.password) == ("user", "pw")
    assert env_proxy("http://127.0.0.1:5000/v1") == (None, None)  # exempt
    assert env_proxy("http://gpu-box:5000/v1") == (None, None)  # no HTTP_PROXY for http
