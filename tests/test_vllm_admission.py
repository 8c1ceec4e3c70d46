"""The gate that holds requests until vLLM has room (nip_core/lm_server/engines/vllm/admission.py)."""

from __future__ import annotations

import asyncio

import pytest

from nip_core.lm_server.engines.vllm.admission import SequenceGate
from nip_core.lm_server.engines.vllm.config import VllmServeConfig


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def request(
    gate: SequenceGate,
    admitted: list[str],
    name: str,
    sequences: int,
    until: asyncio.Event | None = None,
) -> None:
    """Note `name` once admitted, then hold the gate until `until` is set."""
    async with gate.admit(sequences):
        admitted.append(name)
        if until is not None:
            await until.wait()


def test_requests_are_admitted_in_order_and_counted_in_sequences() -> None:
    async def scenario() -> list[str]:
        gate, order = SequenceGate(4), []
        first_done = asyncio.Event()
        first = asyncio.create_task(request(gate, order, "a3", 3, first_done))
        await settle()
        waiting = [
            asyncio.create_task(request(gate, order, n, s)) for n, s in (("b3", 3), ("c1", 1))
        ]
        await settle()
        # c1 would fit beside a3 (3 + 1 <= 4) but does not overtake b3, which came first
        assert order == ["a3"] and gate.held == 3 and gate.queued == 4
        first_done.set()
        await asyncio.gather(first, *waiting)
        assert gate.held == 0 and gate.queued == 0
        return order

    assert asyncio.run(scenario()) == ["a3", "b3", "c1"]


def test_a_request_larger_than_the_gate_runs_alone() -> None:
    async def scenario() -> None:
        gate = SequenceGate(4)
        async with gate.admit(16):
            assert gate.held == 4
        assert gate.held == 0

    asyncio.run(scenario())


def test_a_request_cancelled_while_waiting_leaves_no_trace() -> None:
    async def scenario() -> None:
        gate, release = SequenceGate(2), asyncio.Event()
        admitted: list[str] = []
        holder = asyncio.create_task(request(gate, admitted, "a", 2, release))
        await settle()
        cancelled = asyncio.create_task(request(gate, admitted, "b", 2))
        behind = asyncio.create_task(request(gate, admitted, "c", 1))
        await settle()
        cancelled.cancel()
        await settle()
        assert admitted == ["a"] and gate.queued == 1  # c still waits for a's room
        release.set()
        await asyncio.gather(holder, behind)
        assert cancelled.cancelled()
        assert admitted == ["a", "c"] and gate.held == 0 and gate.queued == 0

    asyncio.run(scenario())


def test_a_cancelled_head_of_the_queue_lets_the_next_one_in() -> None:
    async def scenario() -> None:
        gate, release, admitted = SequenceGate(3), asyncio.Event(), []
        holder = asyncio.create_task(request(gate, admitted, "holder", 2, release))
        await settle()
        big = asyncio.create_task(request(gate, admitted, "big", 3))  # waits for the whole gate
        small = asyncio.create_task(request(gate, admitted, "small", 1))  # fits, waits behind big
        await settle()
        assert not small.done()
        big.cancel()
        await settle()
        assert small.done() and gate.held == 2 and admitted == ["holder", "small"]
        release.set()
        await holder
        assert gate.held == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("capacity", [0, -1, 2.5, True])
def test_capacity_must_be_a_positive_integer(capacity) -> None:
    with pytest.raises(ValueError, match="capacity must be an integer >= 1"):
        SequenceGate(capacity)


def test_only_cpu_processes_are_gated_at_twice_what_they_run() -> None:
    assert VllmServeConfig("/m", device="cpu").admitted_sequences == 128
    assert VllmServeConfig("/m", device="cpu", cpu_max_num_seqs=16).admitted_sequences == 32
    assert VllmServeConfig("/m", device="gpu").admitted_sequences is None
