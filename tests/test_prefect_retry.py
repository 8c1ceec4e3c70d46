"""Retry policy: only transient network failures are retried, by Prefect, on network stages.

pytest tests/test_prefect_retry.py
"""

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest
from prefect import flow, task
from prefect.states import Failed

from nip_core.agents.clients import ModelCallError
from nip_core.agents.retry import is_transient, is_unreadable_reply
from nip_core.run.artifacts import ArtifactError
from tasks import retry_transient_only
from tasks.fine_tune import fine_tune_task, switch_model_task
from tasks.rollouts import generate_rollouts_task

REQUEST = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")


def response(status: int) -> httpx.Response:
    return httpx.Response(status, request=REQUEST)


def raised(fn: Callable[[], object]) -> BaseException:
    """The exception `fn` raises, with its traceback (where it was raised matters)."""
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - captured for the test
        return e
    raise AssertionError("did not raise")


def garbled(body: bytes) -> Callable[[], object]:
    """Reading a garbled 200 reply the way the SDKs do: httpx's `Response.json()`."""
    return lambda: httpx.Response(200, content=body, request=REQUEST).json()


# Decode errors that escaped an HTTP client reading a reply body: transient.
UNREADABLE = [
    raised(garbled(b'{"choices": "caf\xe9"}')),  # UnicodeDecodeError
    raised(garbled(b"<html><h1>502 Bad Gateway</h1></html>")),  # JSONDecodeError
    raised(garbled(b'{"choices": [{"index": 0, "mess')),  # truncated JSON
]
# The same errors raised by our own code (a corrupt local file): permanent.
LOCAL_DECODE_ERRORS = [
    raised(lambda: b"caf\xe9".decode("utf-8")),
    raised(lambda: json.loads('{"stage": "rollo')),
]


TRANSIENT = [
    ModelCallError("rate limited 7 times", status=429, transient=True),
    openai.RateLimitError("slow down", response=response(429), body=None),
    openai.APIConnectionError(request=REQUEST),
    openai.APITimeoutError(request=REQUEST),
    openai.InternalServerError("bad gateway", response=response(502), body=None),
    openai.APIResponseValidationError(response=response(200), body="<html>"),
    httpx.ConnectTimeout("connect timed out", request=REQUEST),
    httpx.ReadError("connection reset", request=REQUEST),
    httpx.RemoteProtocolError("server hung up", request=REQUEST),
    TimeoutError("poll timed out"),
    ConnectionRefusedError("refused"),
    ExceptionGroup("shards", [TimeoutError("a"), ModelCallError("b", transient=True)]),
    ModelCallError("gave up after 7 attempts: unreadable reply (HTTP 200)", transient=True),
    *UNREADABLE,
    ExceptionGroup("shards", [UNREADABLE[0], ModelCallError("b", status=503, transient=True)]),
]
PERMANENT = [
    ModelCallError("model not found", status=404, transient=False),
    openai.AuthenticationError("bad key", response=response(401), body=None),
    openai.BadRequestError("context too long", response=response(400), body=None),
    ValueError("unknown protocol 'foo'"),
    KeyError("agents"),
    ArtifactError("nodes.parquet: checksum mismatch"),
    RuntimeError("fine-tune job failed: loss is nan"),
    ExceptionGroup("shards", [TimeoutError("a"), ValueError("bad config")]),
    *LOCAL_DECODE_ERRORS,
    ExceptionGroup("shards", [UNREADABLE[1], LOCAL_DECODE_ERRORS[1]]),
]


@pytest.mark.parametrize("error", TRANSIENT, ids=lambda e: type(e).__name__)
def test_transient_errors_are_retried(error):
    assert is_transient(error)
    assert retry_transient_only(None, None, Failed(data=error)) is True


@pytest.mark.parametrize("error", PERMANENT, ids=lambda e: type(e).__name__)
def test_permanent_errors_are_not_retried(error):
    assert not is_transient(error)
    assert retry_transient_only(None, None, Failed(data=error)) is False


def test_decode_errors_are_judged_by_where_they_were_raised():
    assert all(is_unreadable_reply(e) for e in UNREADABLE)
    assert not any(is_unreadable_reply(e) for e in LOCAL_DECODE_ERRORS)
    assert isinstance(UNREADABLE[0], UnicodeDecodeError)
    assert all(isinstance(e, json.JSONDecodeError) for e in UNREADABLE[1:])
    assert not is_unreadable_reply(json.JSONDecodeError("made up", "{", 0))  # no traceback


@contextlib.contextmanager
def garbage_server(bodies: list[bytes]) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering request k with 200 and `bodies[k]` (then the last)."""
    count = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            self.rfile.read(int(self.headers["Content-Length"]))
            body = bodies[min(count[0], len(bodies) - 1)]
            count[0] += 1
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


GOOD_COMPLETION = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
    }
).encode()


@pytest.mark.parametrize("body", [b'{"choices": "caf\xe9"}', b"<html>502</html>", b'{"choi'])
def test_decode_errors_escaping_the_openai_sdk_are_transient(body: bytes):
    """Code that calls the SDK directly (not our chat client) lets these errors escape."""
    with garbage_server([body]) as url:
        sdk = openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=5)
        error = raised(lambda: sdk.chat.completions.create(model="m", messages=[]))
        sdk.close()
    assert isinstance(error, (UnicodeDecodeError, json.JSONDecodeError))
    assert is_transient(error)
    assert retry_transient_only(None, None, Failed(data=error)) is True


def test_state_without_exception_is_not_retried():
    assert retry_transient_only(None, None, Failed(message="crashed")) is False


def test_network_stages_retry_transient_only_and_others_never():
    for network_task in (generate_rollouts_task, fine_tune_task, switch_model_task):
        assert network_task.retries >= 1, network_task.name
        assert network_task.retry_condition_fn is retry_transient_only, network_task.name
    from tasks.export import export_datasets_task
    from tasks.pairs import select_pairs_task
    from tasks.rewards import estimate_rewards_task

    for local_task in (estimate_rewards_task, select_pairs_task, export_datasets_task):
        assert not local_task.retries, local_task.name


def test_prefect_retries_a_transient_failure_but_not_a_config_error(prefect_harness):
    calls = {"flaky": 0, "broken": 0}

    @task(retries=3, retry_delay_seconds=0, retry_condition_fn=retry_transient_only)
    def flaky() -> str:
        calls["flaky"] += 1
        if calls["flaky"] < 3:
            raise ModelCallError("503 from provider", status=503, transient=True)
        return "ok"

    @task(retries=3, retry_delay_seconds=0, retry_condition_fn=retry_transient_only)
    def broken() -> None:
        calls["broken"] += 1
        raise ValueError("rl.learning_rate must be > 0")

    @flow
    def both() -> str:
        result = flaky()
        with pytest.raises(ValueError, match="learning_rate"):
            broken()
        return result

    assert both() == "ok"
    assert calls == {"flaky": 3, "broken": 1}


def test_prefect_retries_a_stage_that_read_garbled_replies(prefect_harness):
    """A garbled reply body escaping as JSONDecodeError is retried; a local one is not."""
    bodies = [b"<html>Bad gateway</html>", b'{"choices": [{"ind', GOOD_COMPLETION]
    calls = {"network": 0, "local": 0}

    with garbage_server(bodies) as url:

        @task(retries=3, retry_delay_seconds=0, retry_condition_fn=retry_transient_only)
        def network() -> str:
            calls["network"] += 1
            with openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=5) as sdk:
                reply = sdk.chat.completions.create(model="m", messages=[])
            return reply.choices[0].message.content

        @task(retries=3, retry_delay_seconds=0, retry_condition_fn=retry_transient_only)
        def local() -> None:
            calls["local"] += 1
            json.loads('{"truncated": ')

        @flow
        def both() -> str:
            result = network()
            with pytest.raises(json.JSONDecodeError):
                local()
            return result

        assert both() == "ok"
    assert calls == {"network": 3, "local": 1}
