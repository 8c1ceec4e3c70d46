"""How likely a served model finds given replies: our server's `/v1/chat/score` extension.

Used by the switch guard to tell a fine-tuned model that still writes the language apart from
one a DPO step wrecked. Only our self-hosted server offers it; other providers return None.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import httpx

from nip_core.agents.clients import (
    AgentSettings,
    api_endpoint,
    provider_of,
    request_timeout,
)

CHUNK = 256  # conversations per request (the server takes at most 256): the fewer, the fewer waits


def score_replies(
    agent_params: AgentSettings, model: str, conversations: Sequence[list[dict]]
) -> list[tuple[float, int]] | None:
    """(log-probability, tokens) of each conversation's last message under `model`, or None
    where the agent's provider cannot score."""
    if not provider_of(agent_params).self_hosted:  # OpenAI, OpenRouter, the dummy API
        return None
    if not conversations:
        return []
    base_url, key_env = api_endpoint(agent_params)
    headers = {"Authorization": f"Bearer {os.environ[key_env]}"} if key_env else {}
    results: list[tuple[float, int]] = []
    with httpx.Client(timeout=request_timeout(agent_params), headers=headers) as client:
        for start in range(0, len(conversations), CHUNK):
            chunk = list(conversations[start : start + CHUNK])
            reply = client.post(
                f"{base_url}/chat/score", json={"model": model, "conversations": chunk}
            )
            if reply.status_code in (404, 501):  # an engine or a server without scoring
                return None
            reply.raise_for_status()
            data = sorted(reply.json()["data"], key=lambda d: d["index"])
            if len(data) != len(chunk):
                raise ValueError(f"score reply has {len(data)} entries for {len(chunk)} chats")
            results += [(float(d["logprob"]), int(d["tokens"])) for d in data]
    return results
