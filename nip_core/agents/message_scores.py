"""How likely a served model finds given replies: our server's `/v1/chat/score` extension.

Used by the switch guard to tell a fine-tuned model that still writes the language apart from
one a DPO step wrecked. Only our self-hosted server offers it; other providers return None.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import httpx

from nip_core.agents.clients import (
    AgentSettings,
    api_endpoint,
    provider_of,
    request_timeout,
)

CHUNK = 256  # conversations per request (the server takes at most 256): the fewer, the fewer waits
Score = TypeVar("Score")


def scored_once(
    score: Callable[[list[list[dict]]], list[Score] | None], chats: Sequence[list[dict]]
) -> list[Score] | None:
    """`score(chats)` with each distinct chat sent once. The evaluations repeat chats: in the
    fill-in protocols a pair's two orders share one prompt and the same two replies, and both
    samples of a datapoint share its verdict chats (353 of 1,040 chats distinct on the test
    split of scripts/best_of_n.py)."""
    keys = [json.dumps(chat, sort_keys=True) for chat in chats]
    distinct = dict(zip(keys, chats, strict=True))  # equal keys hold equal chats
    scored = score(list(distinct.values()))
    if scored is None:
        return None
    if len(scored) != len(distinct):
        raise ValueError(f"{len(scored)} scores for {len(distinct)} distinct chats")
    by_key = dict(zip(distinct, scored, strict=True))
    return [by_key[key] for key in keys]


def score_replies(
    agent_params: AgentSettings, model: str, conversations: Sequence[list[dict]]
) -> list[tuple[float, int]] | None:
    """(log-probability, tokens) of each conversation's last message under `model`, or None
    where the agent's provider cannot score."""
    if not provider_of(agent_params).self_hosted:  # OpenAI, OpenRouter, the dummy API
        return None
    if not conversations:
        return []
    return scored_once(lambda chats: _score_over_http(agent_params, model, chats), conversations)


def _score_over_http(
    agent_params: AgentSettings, model: str, conversations: list[list[dict]]
) -> list[tuple[float, int]] | None:
    """One `/v1/chat/score` request per CHUNK conversations; None where the server cannot."""
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
