"""Providers checked before a run writes anything: one `error:` line, exit status 2."""

from __future__ import annotations

import socket

import httpx
import pytest

from flows.malt_iteration import main as iteration_main
from nip_core.agents.preflight import provider_problems
from nip_core.parameters.agents import PureTextAgentParameters


def agent(**fields) -> PureTextAgentParameters:
    return PureTextAgentParameters(**fields)


def answering(status: int):
    calls = []

    def probe(url, headers):
        calls.append((url, headers))
        return status

    return probe, calls


def test_problems_by_hand(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    probe, calls = answering(200)
    openai = agent(model_provider="OpenAI")
    [missing] = provider_problems({"verifier": openai}, set(), probe)
    assert "agent verifier (provider OpenAI)" in missing and "$OPENAI_API_KEY" in missing
    assert calls == []  # no key: nothing probed
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://example.test/v1/")
    assert provider_problems({"verifier": openai, "prover": openai}, set(), probe) == []
    assert calls == [("http://example.test/v1/models", {"Authorization": "Bearer sk-test"})]
    for status, needle in [(401, "rejects the key"), (404, "is the base URL right"), (500, "500")]:
        [problem] = provider_problems({"verifier": openai}, set(), answering(status)[0])
        assert needle in problem and "http://example.test/v1" in problem

    def dead(url, headers):
        raise httpx.ConnectError("refused")

    [problem] = provider_problems({"verifier": openai}, set(), dead)
    assert "nothing answers at http://example.test/v1" in problem


def test_dummy_local_servers_and_fine_tuning(monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    probe, calls = answering(200)
    local = agent(model_provider="SelfHosted", language_model_server_scheme_host="http://127.0.0.1")
    dummy = agent(model_provider="OpenAI", use_dummy_api=True)
    assert provider_problems({"a": local, "b": dummy}, {"a", "b"}, probe) == []
    assert calls == []  # the run starts a local server itself; the dummy calls nobody
    router = agent(model_provider="OpenRouter")
    assert provider_problems({"p": router}, set(), probe) == []  # frozen: chat is enough
    [problem] = provider_problems({"p": router}, {"p"}, probe)
    assert "cannot fine-tune" in problem and "agents.p.freeze_agent=true" in problem


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("overrides", "env", "needle"),
    [
        (["agents._default.model_provider=OpenAI"], {}, "$OPENAI_API_KEY, which is not set"),
        (
            ["agents._default.model_provider=OpenAI"],
            {"OPENAI_API_KEY": "sk-x", "OPENAI_BASE_URL": "http://127.0.0.1:{port}/v1"},
            "nothing answers at http://127.0.0.1:{port}/v1",
        ),
        (
            [
                "agents._default.model_provider=SelfHosted",
                "agents._default.language_model_server_scheme_host=http://127.0.0.2",
                "agents._default.language_model_server_port={port}",
            ],
            {},
            "nothing answers at http://127.0.0.2:{port}/v1",
        ),
    ],
    ids=["no-key", "wrong-base-url", "dead-self-hosted-port"],
)
def test_cli_fails_before_writing_anything(tmp_path, capsys, monkeypatch, overrides, env, needle):
    port = free_port()
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(port=port))
    sets = [w for o in [*overrides, "agents._default.use_dummy_api=false"] for w in ("--set", o)]
    args = [*(s.format(port=port) for s in sets), "--artifacts-root", str(tmp_path)]
    assert iteration_main([*args, "--run-name", "pre", "--no-wandb"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert needle.format(port=port) in err[0]
    assert list(tmp_path.iterdir()) == []  # nothing written
