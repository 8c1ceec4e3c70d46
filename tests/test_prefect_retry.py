"""Retry policy: only transient network failures are retried, by Prefect, on network stages.

pytest tests/test_prefect_retry.py
"""

import httpx
import openai
import pytest
from prefect import flow, task
from prefect.states import Failed

from nip_core.agents.clients import ModelCallError
from nip_core.artifacts import ArtifactError
from tasks.fine_tune import fine_tune_task, switch_model_task
from tasks.retry import is_transient, retry_transient_only
from tasks.rollouts import generate_rollouts_task

REQUEST = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")


def response(status: int) -> httpx.Response:
    return httpx.Response(status, request=REQUEST)


TRANSIENT = [
    ModelCallError("rate limited 7 times", status=429, transient=True),
    openai.RateLimitError("slow down", response=response(429), body=None),
    openai.APIConnectionError(request=REQUEST),
    openai.APITimeoutError(request=REQUEST),
    openai.InternalServerError("bad gateway", response=response(502), body=None),
    httpx.ConnectTimeout("connect timed out", request=REQUEST),
    httpx.ReadError("connection reset", request=REQUEST),
    httpx.RemoteProtocolError("server hung up", request=REQUEST),
    TimeoutError("poll timed out"),
    ConnectionRefusedError("refused"),
    ExceptionGroup("shards", [TimeoutError("a"), ModelCallError("b", transient=True)]),
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
]


@pytest.mark.parametrize("error", TRANSIENT, ids=lambda e: type(e).__name__)
def test_transient_errors_are_retried(error):
    assert is_transient(error)
    assert retry_transient_only(None, None, Failed(data=error)) is True


@pytest.mark.parametrize("error", PERMANENT, ids=lambda e: type(e).__name__)
def test_permanent_errors_are_not_retried(error):
    assert not is_transient(error)
    assert retry_transient_only(None, None, Failed(data=error)) is False


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
