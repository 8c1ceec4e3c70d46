"""Log-likelihood of an assistant message under a model vLLM serves (`/v1/chat/score`, ours).

As the transformers engine does it (`hf_scoring`): the last message is scored as the reply to the
ones before it, rendered by the chat template as generation renders a prompt. vLLM tokenizes the
earlier messages with the generation prompt (`/tokenize`, the reply's first position) and the
whole conversation with its last message left open (`continue_final_message`).

A short reply (a verdict) is scored token by token: one one-token completion per distinct prefix
of the reply, asking for exactly the next tokens' log-probabilities (`logprob_token_ids`). Those
prompts are read from vLLM's prefix cache after the first, and the accept and reject replies to
one chat share all but their last prefixes. vLLM's `prompt_logprobs` instead skips the prefix
cache and computes the output head over every prompt token: scoring the 288 verdicts of the easy
experiment's evaluation that way took ~10 s a conversation on the 2-core CPU. A long reply (the
switch guard's) is scored in one `prompt_logprobs` request, where one request beats hundreds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nip_core.lm_server.engines.vllm.instance import VllmInstance, error_message

# Conversations scored at once: vLLM batches their prompts (one at a time, a 2-core CPU read
# ~90 prompt tokens/s; batched, several hundred).
SCORE_CONCURRENCY = 16
# Replies of at most this many tokens are scored token by token, longer ones in one request.
TOKENWISE_MAX_TOKENS = 16


@dataclass(frozen=True)
class TokenizedReply:
    """A conversation's token ids (last message open) and where its last message starts."""

    ids: tuple[int, ...]
    start: int

    @property
    def length(self) -> int:
        return max(len(self.ids) - self.start, 0)


async def _json(
    instance: VllmInstance, route: str, body: dict[str, Any], sequences: int = 0
) -> dict:
    """`sequences`: 1 for a request vLLM schedules as a sequence, 0 for `/tokenize`."""
    response = await instance.post(route, body, sequences=sequences)
    instance.raise_for_server_error(response, f"scoring ({route})")
    if response.status_code >= 400:
        raise ValueError(f"vLLM rejected the score request: {error_message(response)}")
    return response.json()


async def vllm_message_logprobs(
    instance: VllmInstance, model: str, conversations: Sequence[list[dict]]
) -> list[tuple[float, int]]:
    """(sum of token log-probabilities, token count) of each conversation's last message, in
    order; up to SCORE_CONCURRENCY requests in flight."""
    gate = asyncio.Semaphore(SCORE_CONCURRENCY)

    async def gated(call):
        async with gate:
            return await call

    replies = await asyncio.gather(*(gated(_tokenize(instance, model, c)) for c in conversations))
    scores = {i: (0.0, 0) for i, reply in enumerate(replies) if reply.length == 0}
    short = [i for i, r in enumerate(replies) if 0 < r.length <= TOKENWISE_MAX_TOKENS]
    wanted = next_tokens_wanted([replies[i] for i in short])
    found = await _next_token_logprobs(instance, model, wanted, gated)
    scores |= {i: (reply_logprob(replies[i], found), replies[i].length) for i in short}
    long = [i for i in range(len(conversations)) if i not in scores]
    whole = await asyncio.gather(
        *(gated(_prompt_logprobs(instance, model, conversations[i], replies[i])) for i in long)
    )
    scores |= dict(zip(long, whole, strict=True))
    return [scores[i] for i in range(len(conversations))]


async def _tokenize(instance: VllmInstance, model: str, conversation: list[dict]) -> TokenizedReply:
    prefix, whole = await asyncio.gather(
        _json(
            instance,
            "/tokenize",
            {"model": model, "messages": conversation[:-1], "add_generation_prompt": True},
        ),
        _json(
            instance,
            "/tokenize",
            {
                "model": model,
                "messages": conversation,
                "add_generation_prompt": False,
                "continue_final_message": True,
            },
        ),
    )
    return TokenizedReply(tuple(int(t) for t in whole["tokens"]), int(prefix["count"]))


def next_tokens_wanted(
    replies: Sequence[TokenizedReply],
) -> dict[tuple[int, ...], dict[tuple[int, ...], set[int]]]:
    """Every distinct prefix inside the replies and the tokens that follow it in any of them,
    grouped by the chat the replies answer (their common first prefix), shortest first."""
    families: dict[tuple[int, ...], dict[tuple[int, ...], set[int]]] = {}
    for reply in replies:
        family = families.setdefault(reply.ids[: reply.start], {})
        for position in range(reply.start, len(reply.ids)):
            family.setdefault(reply.ids[:position], set()).add(reply.ids[position])
    return {
        root: dict(sorted(f.items(), key=lambda kv: len(kv[0]))) for root, f in families.items()
    }


def reply_logprob(reply: TokenizedReply, found: dict[tuple[tuple[int, ...], int], float]) -> float:
    """The reply's log-likelihood from the next-token log-probabilities of its prefixes."""
    return sum(
        found[reply.ids[:position], reply.ids[position]]
        for position in range(reply.start, len(reply.ids))
    )


async def _next_token_logprobs(
    instance: VllmInstance,
    model: str,
    families: dict[tuple[int, ...], dict[tuple[int, ...], set[int]]],
    gated,
) -> dict[tuple[tuple[int, ...], int], float]:
    """log p(token | prefix) for each wanted pair. Each chat's shortest prefix goes first and its
    longer ones after it, so those find the chat's tokens in vLLM's prefix cache."""
    found: dict[tuple[tuple[int, ...], int], float] = {}

    async def one(prefix: tuple[int, ...], tokens: list[int]) -> None:
        body = {
            "model": model,
            "prompt": list(prefix),
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": 1,
            "logprob_token_ids": tokens,
            "return_tokens_as_token_ids": True,
        }
        reply = await gated(_json(instance, "/v1/completions", body, sequences=1))
        top = reply["choices"][0]["logprobs"]["top_logprobs"][0]
        for token in tokens:
            key = f"token_id:{token}"
            if key not in top:
                raise ValueError(f"vLLM did not return the log-probability of token {token}")
            found[prefix, token] = float(top[key])

    async def family(wanted: dict[tuple[int, ...], set[int]]) -> None:
        [(first, tokens), *rest] = wanted.items()
        await one(first, sorted(tokens))
        await asyncio.gather(*(one(prefix, sorted(tokens)) for prefix, tokens in rest))

    await asyncio.gather(*(family(wanted) for wanted in families.values()))
    return found


async def _prompt_logprobs(
    instance: VllmInstance, model: str, conversation: list[dict], reply: TokenizedReply
) -> tuple[float, int]:
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
    answer = await _json(instance, "/v1/chat/completions", body, sequences=1)
    ids, logprobs = answer["prompt_token_ids"], answer["prompt_logprobs"]
    start = reply.start
    if len(ids) <= start:
        return 0.0, 0
    total = sum(float(logprobs[i][str(ids[i])]["logprob"]) for i in range(start, len(ids)))
    return total, len(ids) - start
