"""Several replicas of a model server: spread by least outstanding requests, fail-over when one
goes away. Two real servers (the dummy engine) behind the pipeline's own client factory."""

from __future__ import annotations

import asyncio

import pytest

from nip_core.agents.chat_client import ModelCallError, SamplingParams
from nip_core.agents.clients import make_chat_client
from nip_core.agents.replica_client import ReplicaChatClient
from nip_core.parameters import PureTextAgentParameters
from tests.conftest_lm import running_server

MESSAGES = [{"role": "user", "content": "Hello"}]


def replica_params(*urls: str) -> PureTextAgentParameters:
    return PureTextAgentParameters(
        model_provider="SelfHosted", model_server_replicas=[f"{u}/v1" for u in urls]
    )


async def ask(client, model: str, count: int) -> list[list[str]]:
    calls = (client.complete(MESSAGES, model, 2, SamplingParams(seed=s)) for s in range(count))
    return await asyncio.gather(*calls)


def test_requests_spread_over_replicas_and_fail_over(tmp_path):
    with (
        running_server(["--engine", "dummy"], tmp_path / "a") as first,
        running_server(["--engine", "dummy"], tmp_path / "b") as second,
    ):
        model = first.client().models.list().data[0].id
        client = make_chat_client(replica_params(first.url, second.url), max_concurrency=64)
        assert isinstance(client, ReplicaChatClient)

        async def both_up():
            answers = await ask(client, model, 40)
            await client.aclose()
            return answers

        answers = asyncio.run(both_up())
        assert all(len(a) == 2 for a in answers)
        assert all(count > 0 for count in client.calls_per_replica), client.calls_per_replica
        assert sum(client.calls_per_replica) == 40
        second.stop()

        async def one_down():
            answers = await ask(client, model, 20)
            await client.aclose()
            return answers

        answers = asyncio.run(one_down())
        assert len(answers) == 20 and client.failures_per_replica[1] >= 1
        assert client.calls_per_replica[0] >= 20 + 1  # every request after the failure went there


def test_every_replica_down_is_a_transient_model_call_error():
    client = make_chat_client(replica_params("http://127.0.0.1:9", "http://127.0.0.1:10"))
    client.retry_policy.attempts = 2
    client.retry_policy.base_seconds = 0.0
    with pytest.raises(ModelCallError) as caught:
        asyncio.run(client.complete(MESSAGES, "m", 1, SamplingParams(seed=1)))
    assert caught.value.transient and "every replica failed" in str(caught.value)


def test_replica_urls_are_validated():
    with pytest.raises(ValueError, match="model_server_replicas"):
        PureTextAgentParameters(model_server_replicas=["ftp://nope"])
