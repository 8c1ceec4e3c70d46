"""Which client an agent gets: one `Provider` record per `model_provider`, and the factory.

What differs between OpenAI, OpenRouter and our self-hosted server (endpoint, key variable,
default request timeout, the fine-tuning minimum, our LoRA extension, a server to start) is
decided here, in one table, instead of string tests spread through the pipeline.

    client = make_chat_client(agent_params, max_concurrency=256, dummy_seed=seed)
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse

from nip_core.agents.chat_client import (
    ChatClient,
    ModelCallError,
    SamplingParams,
    close_clients,
    request_digest,
)
from nip_core.agents.dummy_client import DummyChatClient
from nip_core.agents.http_client import DirectHttpChatClient
from nip_core.agents.replica_client import ReplicaChatClient
from nip_core.agents.retry import parse_retry_after as _parse_retry_after
from nip_core.parameters.agents import PureTextAgentParameters

__all__ = [
    "HOSTED_API_TIMEOUT",
    "PROVIDERS",
    "SELF_HOSTED_TIMEOUT",
    "ChatClient",
    "DirectHttpChatClient",
    "DummyChatClient",
    "ModelCallError",
    "Provider",
    "SamplingParams",
    "_parse_retry_after",
    "api_endpoint",
    "close_clients",
    "make_chat_client",
    "provider_of",
    "request_digest",
    "request_timeout",
    "self_hosted_url",
    "served_at",
]

OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"
SELF_HOSTED_TOKEN_ENV = "NIP_LM_SERVER_TOKEN"
# Default seconds per request when an agent leaves `request_timeout_seconds` unset: a self-hosted
# CPU server answers a whole batched tree level at once, so it gets much longer than an API.
SELF_HOSTED_TIMEOUT = 900.0
HOSTED_API_TIMEOUT = 120.0
OPENAI_MIN_EXAMPLES = 10  # OpenAI rejects fine-tuning files with fewer examples
# An agent's parameters, or the same fields as a plain mapping (e.g. a stored config).
AgentSettings = PureTextAgentParameters | Mapping[str, Any]


@dataclass(frozen=True)
class Provider:
    """What one `model_provider` value means to the pipeline."""

    name: str
    base_url: str | None  # None: $OPENAI_BASE_URL, else api.openai.com; self-hosted: per agent
    key_env: str | None  # environment variable holding the API key
    key_required: bool  # fine-tuning refuses to start without the key
    request_timeout: float  # default seconds per request
    min_training_examples: int
    sends_lora_options: bool  # our server's `nip_training` extension and batch size
    self_hosted: bool  # a server we start, health-check and version-check ourselves
    offline: bool = False  # the dummy API's stand-in: deterministic replies, no network


def offline_stand_in(provider: Provider) -> Provider:
    """The dummy API (`use_dummy_api`) standing in for `provider`: its fine-tuning minimum and
    defaults, but replies from `DummyChatClient`, fake fine-tuning jobs, no server, no key."""
    return replace(provider, key_required=False, self_hosted=False, offline=True)


PROVIDERS: dict[str, Provider] = {
    "OpenAI": Provider(
        "OpenAI", None, "OPENAI_API_KEY", True, HOSTED_API_TIMEOUT, OPENAI_MIN_EXAMPLES,
        sends_lora_options=False, self_hosted=False,
    ),
    "OpenRouter": Provider(
        "OpenRouter", OPENROUTER_BASE_URL, "OPENROUTER_API_KEY", True, HOSTED_API_TIMEOUT, 1,
        sends_lora_options=False, self_hosted=False,
    ),
    "SelfHosted": Provider(
        "SelfHosted", None, SELF_HOSTED_TOKEN_ENV, False, SELF_HOSTED_TIMEOUT, 1,
        sends_lora_options=True, self_hosted=True,
    ),
}  # fmt: skip


def _param(agent_params: AgentSettings, name: str, default: Any = None) -> Any:
    """Read a field from a parameters object or a plain mapping."""
    if isinstance(agent_params, Mapping):
        return agent_params.get(name, default)
    return getattr(agent_params, name, default)


def provider_of(agent_params: AgentSettings) -> Provider:
    """The `Provider` record of an agent's `model_provider`."""
    name = _param(agent_params, "model_provider", "OpenAI")
    if name not in PROVIDERS:
        raise ValueError(
            f"unknown model_provider {name!r}; expected one of {', '.join(map(repr, PROVIDERS))}"
        )
    if _param(agent_params, "use_dummy_api", False):
        return offline_stand_in(PROVIDERS[name])
    return PROVIDERS[name]


def request_timeout(agent_params: AgentSettings) -> float:
    """Seconds one model request of this agent may take before it counts as timed out.

    The agent's `request_timeout_seconds` when set, else its provider's default: 900 s for
    `model_provider="SelfHosted"`, 120 s for OpenAI and OpenRouter.
    """
    value = _param(agent_params, "request_timeout_seconds", None)
    if value is None:
        return provider_of(agent_params).request_timeout
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"request_timeout_seconds must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"request_timeout_seconds must be > 0 and finite, got {value!r}")
    return float(value)


def api_endpoint(agent_params: AgentSettings) -> tuple[str | None, str | None]:
    """(base URL, env var holding the API key) of an agent's provider; None key = no key."""
    provider = provider_of(agent_params)
    if not provider.self_hosted:
        return provider.base_url, provider.key_env
    key_env = provider.key_env if os.environ.get(provider.key_env or "") else None
    return f"{self_hosted_url(agent_params)}/v1", key_env


def self_hosted_url(agent_params: AgentSettings) -> str:
    """scheme://host:port of the self-hosted server: the agent's
    `language_model_server_scheme_host` and `language_model_server_port` (a run's context holds
    the server the run really uses there, `served_at`)."""
    host = _param(agent_params, "language_model_server_scheme_host", "http://localhost")
    port = _param(agent_params, "language_model_server_port", 5000)
    return f"{str(host).rstrip('/')}:{port}"


def served_at(agent_params: PureTextAgentParameters, url: str) -> PureTextAgentParameters:
    """The agent's settings pointed at the self-hosted server at `url` (scheme://host:port);
    unchanged for an agent our server does not serve (another provider, the dummy API).

    A run that finds its configured port held by another run's server starts one elsewhere;
    its clients learn the new address from these settings, not from process-wide state."""
    if not provider_of(agent_params).self_hosted:
        return agent_params
    parsed = urlparse(url)
    if parsed.port is None or not parsed.scheme or not parsed.hostname:
        raise ValueError(f"a server URL needs scheme://host:port, got {url!r}")
    scheme_host = url.rstrip("/").removesuffix(f":{parsed.port}")
    if (
        agent_params.language_model_server_scheme_host == scheme_host
        and agent_params.language_model_server_port == parsed.port
    ):
        return agent_params
    return replace(
        agent_params,
        language_model_server_scheme_host=scheme_host,
        language_model_server_port=parsed.port,
    )


def make_chat_client(
    agent_params: AgentSettings, *, max_concurrency: int = 32, dummy_seed: int = 0
) -> ChatClient:
    """Build the client an agent's parameters ask for.

    Reads `use_dummy_api`, `model_provider` (a key of `PROVIDERS`), `request_timeout_seconds`
    (see `request_timeout`) and, for self-hosting, `language_model_server_scheme_host` /
    `language_model_server_port`. Callers cache clients per endpoint; this always builds one.
    Chat goes through `DirectHttpChatClient` for every provider (one per replica in
    `model_server_replicas`); the `openai` SDK serves only files and fine-tuning jobs.
    """
    if provider_of(agent_params).offline:
        # Test knobs: a simulated latency and a call log shared across processes.
        client = DummyChatClient(
            dummy_seed, latency=float(os.environ.get("NIP_DUMMY_LATENCY", "0") or 0)
        )
        client.call_log = os.environ.get("NIP_DUMMY_CALL_LOG") or None
        return client
    base_url, key_env = api_endpoint(agent_params)
    timeout = request_timeout(agent_params)
    replicas = _param(agent_params, "model_server_replicas", None)
    if replicas:  # fail over at once: the replica client retries elsewhere
        return ReplicaChatClient(
            [
                DirectHttpChatClient(
                    url.rstrip("/"), key_env, max_concurrency=max_concurrency, timeout=timeout,
                    max_retries=0,
                )
                for url in replicas
            ]
        )  # fmt: skip
    return DirectHttpChatClient(base_url, key_env, max_concurrency=max_concurrency, timeout=timeout)
