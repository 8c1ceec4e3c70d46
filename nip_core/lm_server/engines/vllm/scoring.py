"""Log-likelihood of an assistant message under a model vLLM serves (`/v1/chat/score`, ours).

The switch guard asks the previous model how likely the new model's replies are. As the
transformers engine does it (`hf_scoring`): the last message is scored as the reply to the ones
before it, rendered by the chat template as generation renders a prompt. vLLM tokenizes the
prompt of the earlier messages (`/tokenize`, generation prompt added) and returns the
log-probability of every prompt token of the whole conversation with its last message left open
(`continue_final_message`, `prompt_logprobs=0`, one token generated); the reply's tokens are the
ones past the prefix.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from nip_core.lm_server.engines.vllm.instance import VllmInstance, error_message


async def _json(instance: VllmInstance, route: str, body: dict[str, Any]) -> dict:
    response = await instance.post(route, body)
    instance.raise_for_server_error(response, f"scoring ({route})")
    if response.status_code >= 400:
        raise ValueError(f"vLLM rejected the score request: {error_message(response)}")
    return response.json()


# Conversations scored at once: vLLM batches their prompts (one at a time, a 2-core CPU read
# ~90 prompt tokens/s; batched, several hundred).
SCORE_CONCURRENCY = 16


async def message_logprobs(
    instance: VllmInstance, model: str, conversations: Sequence[list[dict]]
) -> list[tuple[float, int]]:
    """(sum of token log-probabilities, token count) of each conversation's last message, in
    order; up to SCORE_CONCURRENCY requests in flight."""
    gate = asyncio.Semaphore(SCORE_CONCURRENCY)

    async def one(conversation: list[dict]) -> tuple[float, int]:
        async with gate:
            return await _message_logprob(instance, model, conversation)

    return list(await asyncio.gather(*(one(c) for c in conversations)))


async def _message_logprob(
    instance: VllmInstance, model: str, conversation: list[dict]
) -> tuple[float, int]:
    prefix = await _json(
        instance,
        "/tokenize",
        {"model": model, "messages": conversation[:-1], "add_generation_prompt": True},
    )
    start = int(prefix["count"])
    body = {
        "model": model,
        "messages": conversation,
        "add_generation_prompt": False,
        "continue_final_message": True,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
        "return_token_ids": True,
    }
    reply = await _json(instance, "/v1/chat/completions", body)
    ids, logprobs = reply["prompt_token_ids"], reply["prompt_logprobs"]
    if len(ids) <= start:  # an empty message: nothing to score
        return 0.0, 0
    total = sum(float(logprobs[i][str(ids[i])]["logprob"]) for i in range(start, len(ids)))
    return total, len(ids) - start
