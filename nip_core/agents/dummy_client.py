"""An offline `ChatClient` for tests and the no-network default: replies from a stable hash.

Replies are shaped like the verifier and prover replies the protocols expect. The randomness
comes from a stable hash, never Python's salted `hash` (nip §8.18).
"""

from __future__ import annotations

import asyncio

from nip_core.agents.chat_client import SamplingParams, check_request, request_digest
from nip_core.model_api.dummy_player import dummy_reply


class DummyChatClient:
    """Offline `ChatClient` whose replies depend only on (seed, sampling.seed, messages, index).

    Verifier prompts get a decision (1/5 accept, 1/5 reject) or a question, one line per
    "Question for <Name>:" header; other prompts get "Answer: ...". A fraction
    `invalid_probability` of verifier replies is malformed so retry paths run; a trailing
    "you must decide" system message always gets a valid decision. Provers are always valid.
    """

    def __init__(
        self, seed: int = 0, *, latency: float = 0.0, invalid_probability: float = 0.1
    ) -> None:
        if latency < 0:
            raise ValueError(f"latency must be >= 0, got {latency}")
        if not 0.0 <= invalid_probability <= 1.0:
            raise ValueError(f"invalid_probability must be in [0, 1], got {invalid_probability}")
        self.seed, self.latency, self.invalid_probability = seed, latency, invalid_probability
        self.calls = 0
        self.call_keys: list[str] = []
        self.call_log: str | None = None

    def reply(self, messages: list[dict], sampling: SamplingParams, index: int) -> str:
        """The `index`-th sampled reply to `messages` (pure; no counters touched)."""
        return dummy_reply(
            messages,
            seed=self.seed,
            request_seed=sampling.seed,
            index=index,
            invalid_probability=self.invalid_probability,
            candidates=sampling.candidates,
        )

    async def complete(
        self, messages: list[dict], model: str, n: int, sampling: SamplingParams
    ) -> list[str]:
        check_request(messages, model, n, sampling)
        if self.latency:
            await asyncio.sleep(self.latency)
        texts = [self.reply(messages, sampling, i) for i in range(n)]
        self.calls += 1
        key = request_digest(messages, model, n, sampling)
        self.call_keys.append(key)
        if self.call_log is not None:  # cross-process record, for resume tests
            with open(self.call_log, "a", encoding="utf-8") as f:
                f.write(key + "\n")
        return texts
