"""One `ChatClient` over several replicas of a model server (e.g. vLLM instances).

Each request goes to the replica with the fewest requests in flight (ties: the one used least
recently), so a slow replica gets less work. A replica whose request fails with a transient
error (connection refused, timeout, 429, 5xx, unreadable reply) is benched for a short cool-down
and the request is retried on another at once; when every replica is failing, the shared retry
policy's back-off applies before the next round. Permanent errors (bad request, unknown model)
are raised as they are.

    client = ReplicaChatClient([DirectHttpChatClient(url, None, max_retries=0) for url in urls])
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
        """Rounds over the replicas (`_one_round`), with the retry policy's back-off between."""

        async def one_round() -> list[str]:
            return await self._one_round(messages, model, n, sampling)

        try:
            return await self.retry_policy.call("replicas", one_round, self._on_retry)
        except Exception as error:
            if not is_transient(error):
                raise
            raise ModelCallError(
                f"every replica failed ({len(self.replicas)} replicas, "
                f"{self.retry_policy.attempts} rounds): {error}",
                transient=True,
            ) from None

    @staticmethod
    def _on_retry(error: BaseException, attempt: int, delay: float) -> None:
        log.warning(
            "every replica failed, round %d (%s); again in %.2fs", attempt + 1, error, delay
        )

    async def _one_round(
        self, messages: list[dict], model: str, n: int, sampling: SamplingParams
    ) -> list[str]:
        """Each replica in turn (fewest in flight first) until one answers; a transient failure
        benches its replica and moves on, the last one is raised when every replica failed."""
        tried: set[int] = set()
        last_error: Exception | None = None
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
        assert last_error is not None  # every round tries at least one replica
        raise last_error

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
