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


class PreflightError(ValueError):
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


def fine_tuning_problem(name: str, params: Any) -> str | None:
    """Why a trained agent's provider cannot train it, or None."""
    provider = provider_of(params)
    if provider.name not in CANNOT_FINE_TUNE:
        return None
    return (
        f"agent {name} (provider {provider.name}) is trained but {provider.name} cannot "
        f"fine-tune; set agents.{name}.freeze_agent=true or use OpenAI or SelfHosted"
    )


def endpoint_problems(name: str, params: Any, probe: Probe) -> list[str]:
    """What stops the agent's endpoint from answering it (empty: nothing)."""
    provider = provider_of(params)
    who = f"agent {name} (provider {provider.name})"
    url = base_url(params)
    if provider.self_hosted and (urlparse(url).hostname or "") in LOOPBACK:
        return []  # the run starts our server here when nothing answers
    _, key_env = api_endpoint(params)
    key = os.environ.get(key_env or "")
    if provider.key_required and not key:
        return [f"{who} needs the API key in ${key_env}, which is not set"]
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        status = probe(f"{url}/models", headers)
    except httpx.HTTPError as e:
        return [f"{who}: nothing answers at {url} ({type(e).__name__}); check the base URL"]
    if status in (401, 403):
        return [f"{who}: {url} rejects the key in ${key_env} (HTTP {status})"]
    if status == 404:
        return [f"{who}: {url}/models not found (HTTP 404); is the base URL right?"]
    if status >= 400:
        return [f"{who}: {url}/models answered HTTP {status}"]
    return []


def provider_problems(
    agent_params: Mapping[str, Any], trained: set[str], probe: Probe = http_probe
) -> list[str]:
    """Every problem of every agent that makes real model calls (the dummy API aside); one
    probe per distinct (endpoint, key)."""
    probed: set[tuple[str, str | None]] = set()
    problems = []
    for name, params in agent_params.items():
        if params.model_provider not in PROVIDERS or provider_of(params).offline:
            continue  # the dummy API; parameter validation names an unknown provider
        if name in trained and (problem := fine_tuning_problem(name, params)):
            problems.append(problem)
        endpoint = (base_url(params), api_endpoint(params)[1])
        if endpoint not in probed:
            probed.add(endpoint)
            problems += endpoint_problems(name, params, probe)
    return problems


def check_providers(
    agent_params: Mapping[str, Any], trained: set[str], probe: Probe = http_probe
) -> None:
    """PreflightError (one line, every problem) when any agent's provider cannot serve."""
    problems = provider_problems(agent_params, trained, probe)
    if problems:
        raise PreflightError("; ".join(problems))
