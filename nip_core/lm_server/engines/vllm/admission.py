"""How many sequences our server hands one vLLM process at once.

vLLM runs at most `--max-num-seqs` sequences and queues the rest; a request's HTTP timeout
counts from when we send it, so a rollout level of 96 requests of n = 16 on the 2-core CPU (1,536
sequences, ~8 minutes of work) timed its last requests out while they were still queued in vLLM,
and each retry sampled its 16 replies again. Holding requests here until vLLM has room makes the
timeout measure a request's own service time, while vLLM still has the next batch waiting.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress


class SequenceGate:
    """A first-come, first-served semaphore counted in sequences (a chat of n samples holds n).

    A request larger than the capacity waits for an empty gate and then holds all of it, so it
    still runs. Waiters are served in order: a small request does not overtake a large one.
    """

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        self.capacity = capacity
        self.held = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def queued(self) -> int:
        """Sequences of requests waiting for admission."""
        return sum(weight for weight, future in self._waiting if not future.done())

    @asynccontextmanager
    async def admit(self, sequences: int) -> AsyncIterator[None]:
        weight = min(max(int(sequences), 1), self.capacity)
        await self._acquire(weight)
        try:
            yield
        finally:
            self._release(weight)

    async def _acquire(self, weight: int) -> None:
        if not self._waiting and self.held + weight <= self.capacity:
            self.held += weight
            return
        entry = (weight, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].done() and not entry[1].cancelled():  # admitted, then cancelled
                self._release(weight)
            else:  # cancelled while waiting: let those behind it move up
                with suppress(ValueError):  # `_admit_waiting` may have dropped it already
                    self._waiting.remove(entry)
                self._admit_waiting()
            raise

    def _release(self, weight: int) -> None:
        self.held -= weight
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        while self._waiting:
            weight, future = self._waiting[0]
            if future.done():  # its waiter was cancelled; it removes itself when it runs
                self._waiting.popleft()
                continue
            if self.held + weight > self.capacity:
                return
            self._waiting.popleft()
            self.held += weight
            future.set_result(None)
