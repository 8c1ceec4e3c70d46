"""One `ChatClient` over several replicas of a model server (e.g. vLLM instances).

Each request goes to the replica with the fewest requests in flight (ties: the one used least
recently), so a slow replica gets less work. A replica whose request fails with a transient
error (connection refused, timeout, 429, 5xx, unreadable reply) is benched for a short cool-down
and the request is retried on another at once; when every replica is failing, the shared retry
policy's back-off applies before the next round. Permanent errors (bad request, unknown model)
are raised as they are.

    client = ReplicaChatClient([OpenAIChatClient(url, None, max_retries=0) for url in urls])
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from nip_core.agents.chat_client import ModelCallError, SamplingParams
from nip_core.agents.retry import RetryPolicy, is_transient

log = logging.getLogger(__name__)
COOL_DOWN_SECONDS = 5.0  # how long a failing replica is avoided


class ReplicaChatClient:
    """Least-outstanding-requests spreading with fail-over; `calls_per_replica` counts."""

    def __init__(self, replicas: Sequence[Any], retry_policy: RetryPolicy | None = None) -> None:
        if not replicas:
            raise ValueError("a replica client needs at least one replica")
        self.replicas = list(replicas)
        self.retry_policy = retry_policy or RetryPolicy(attempts=7)
        self.in_flight = [0] * len(self.replicas)
        self.calls_per_replica = [0] * len(self.replicas)
        self.failures_per_replica = [0] * len(self.replicas)
        self._last_used = [0.0] * len(self.replicas)
        self._benched_until = [0.0] * len(self.replicas)

    def _pick(self, tried: set[int]) -> int | None:
        """The untried, not benched replica with the fewest requests in flight."""
        now = time.monotonic()
        ready = [i for i in range(len(self.replicas)) if i not in tried]
        healthy = [i for i in ready if self._benched_until[i] <= now] or ready
        if not healthy:
            return None
        return min(healthy, key=lambda i: (self.in_flight[i], self._last_used[i]))

    async def complete(
        self, messages: list[dict], model: str, n: int, sampling: SamplingParams
    ) -> list[str]:
        for attempt in range(self.retry_policy.attempts):
            tried: set[int] = set()
            while (index := self._pick(tried)) is not None:
                tried.add(index)
                try:
                    return await self._on(index, messages, model, n, sampling)
                except Exception as error:
                    if not is_transient(error):
                        raise
                    self.failures_per_replica[index] += 1
                    self._benched_until[index] = time.monotonic() + COOL_DOWN_SECONDS
                    log.warning("replica %d failed (%s); trying another", index, error)
                    last_error = error
            if attempt < self.retry_policy.attempts - 1:
                await asyncio.sleep(self.retry_policy.delay(attempt))
        raise ModelCallError(
            f"every replica failed ({len(self.replicas)} replicas, "
            f"{self.retry_policy.attempts} rounds): {last_error}",
            transient=True,
        )

    async def _on(
        self, index: int, messages: list[dict], model: str, n: int, sampling: SamplingParams
    ) -> list[str]:
        self.in_flight[index] += 1
        self._last_used[index] = time.monotonic()
        try:
            texts = await self.replicas[index].complete(messages, model, n, sampling)
        finally:
            self.in_flight[index] -= 1
        self.calls_per_replica[index] += 1
        return texts

    async def aclose(self) -> None:
        await asyncio.gather(*(r.aclose() for r in self.replicas if hasattr(r, "aclose")))
