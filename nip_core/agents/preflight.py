"""Every agent's provider checked before a run writes anything: key, endpoint, fine-tuning.

A missing key or a wrong base URL used to surface minutes into a run, as two tracebacks from
the rollout stage. Here each agent that makes real model calls is checked up front with one
cheap request (`GET <base>/models`, a short timeout); the problems are named by agent, provider
and the endpoint really used (`$OPENAI_BASE_URL` when set), and the flows turn them into one
`error:` line and exit status 2. A self-hosted server on this machine is not probed: the run
starts it when nothing answers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlparse

import httpx

from nip_core.agents.clients import PROVIDERS, api_endpoint, provider_of

PROBE_TIMEOUT = 5.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")
OPENAI_DEFAULT_BASE = "https://api.openai.com/v1"
CANNOT_FINE_TUNE = ("OpenRouter",)  # chat only: no fine-tuning API


class ProviderError(ValueError):
    """A provider that cannot serve the run as configured (a user error: exit status 2)."""


# (url, headers) -> HTTP status, or raises httpx.HTTPError when nothing answers.
Probe = Callable[[str, dict[str, str]], int]


def http_probe(url: str, headers: dict[str, str]) -> int:
    return httpx.get(url, headers=headers, timeout=PROBE_TIMEOUT).status_code


def base_url(params: Any) -> str:
    """The endpoint an agent's calls really go to."""
    url, _ = api_endpoint(params)
    if url is None:  # OpenAI: the SDK's rule, which our chat client follows too
        url = os.environ.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_BASE
    return url.rstrip("/")


def agent_problems(name: str, params: Any, trained: bool, probe: Probe) -> list[str]:
    """What stops this agent's provider from serving the run (empty: nothing)."""
    provider = provider_of(params)
    who = f"agent {name} (provider {provider.name})"
    problems = []
    if trained and provider.name in CANNOT_FINE_TUNE:
        problems.append(
            f"{who} is trained but {provider.name} cannot fine-tune; set "
            f"agents.{name}.freeze_agent=true or use OpenAI or SelfHosted"
        )
    url = base_url(params)
    if provider.self_hosted and (urlparse(url).hostname or "") in LOOPBACK:
        return problems  # the run starts our server here when nothing answers
    _, key_env = api_endpoint(params)
    if provider.key_required and not os.environ.get(key_env or ""):
        return [*problems, f"{who} needs the API key in ${key_env}, which is not set"]
    key = os.environ.get(key_env or "")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        status = probe(f"{url}/models", headers)
    except httpx.HTTPError as e:
        reason = type(e).__name__
        return [*problems, f"{who}: nothing answers at {url} ({reason}); check the base URL"]
    if status in (401, 403):
        problems.append(f"{who}: {url} rejects the key in ${key_env} (HTTP {status})")
    elif status == 404:
        problems.append(f"{who}: {url}/models not found (HTTP 404); is the base URL right?")
    elif status >= 400:
        problems.append(f"{who}: {url}/models answered HTTP {status}")
    return problems


def provider_problems(
    agent_params: Mapping[str, Any], trained: set[str], probe: Probe = http_probe
) -> list[str]:
    """Every problem of every agent that makes real model calls (the dummy API aside); one
    probe per distinct (endpoint, key)."""
    seen: dict[tuple[str, str | None], list[str]] = {}
    problems = []
    for name, params in agent_params.items():
        if getattr(params, "use_dummy_api", False):
            continue
        if params.model_provider not in PROVIDERS:
            continue  # parameter validation names an unknown provider
        key = (base_url(params), api_endpoint(params)[1])
        cached = seen.get(key)
        if cached is None:
            cached = seen[key] = agent_problems(name, params, name in trained, probe)
            problems += cached
        elif name in trained and params.model_provider in CANNOT_FINE_TUNE:
            problems += agent_problems(name, params, True, lambda *_: 200)
    return problems


def check_providers(
    agent_params: Mapping[str, Any], trained: set[str], probe: Probe = http_probe
) -> None:
    """ProviderError (one line, every problem) when any agent's provider cannot serve."""
    problems = provider_problems(agent_params, trained, probe)
    if problems:
        raise ProviderError("; ".join(problems))
