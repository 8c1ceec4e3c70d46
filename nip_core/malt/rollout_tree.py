"""Grow MALT response trees for a whole batch of datapoints, every open node at once.

At every round each open node gets `num_responses_per_timestep` children, one joint response of
the agents active in that round per child (one child when every active agent is frozen and
`frozen_agents_generate_one_response` is set). A node's calls leave as soon as its parent's are
answered; the K siblings of a node share their prompts, so each (node, agent) is one model call
with `n = K`.

Node ids come from tree position (`b<batch_index>` for a root, `<parent>.<k>` for its k-th child)
and call seeds from (run seed, iteration, node id, agent), so reruns give identical trees.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from nip_core.agents import AgentResponse, chat_messages, generate_responses
from nip_core.episode import ChannelMessage, Datapoint, Turn
from nip_core.malt import schemas
from nip_core.protocols import Protocol, active_agents, step_outcome
from nip_core.seeding import call_seed

ProgressCallback = Callable[[int, int, int], None]  # (round, calls issued, calls finished)


@dataclass(frozen=True)
class BatchItem:
    """A datapoint at a position of the iteration's batch."""

    batch_index: int
    datapoint: Datapoint
    episode_seed: int


@dataclass(frozen=True)
class RolloutSettings:
    protocol: Protocol
    agent_params: Mapping[str, object]
    models: Mapping[str, str]
    clients: Mapping[str, object]
    frozen_agents: frozenset[str]
    num_responses_per_timestep: int
    frozen_agents_generate_one_response: bool
    run_seed: int
    iteration: int
    max_concurrent_requests: int = 32
    early_verdict_retries: int = 0


@dataclass
class _Node:
    node_id: str
    item: BatchItem
    parent: _Node | None
    round: int
    turn: Turn | None = None
    acted: tuple[str, ...] = ()
    ended: bool = False
    terminated: bool = False
    step_rewards: dict[str, float] = field(default_factory=dict)
    retries: int = 0
    failure: str | None = None

    def turns(self) -> list[Turn]:
        path: list[Turn] = []
        node: _Node | None = self
        while node is not None:
            if node.turn is not None:
                path.append(node.turn)
            node = node.parent
        return path[::-1]


def children_per_node(settings: RolloutSettings, active: Sequence[str]) -> int:
    all_frozen = all(agent in settings.frozen_agents for agent in active)
    if settings.frozen_agents_generate_one_response and all_frozen:
        return 1
    return settings.num_responses_per_timestep


async def grow_trees(
    items: Sequence[BatchItem],
    settings: RolloutSettings,
    progress: ProgressCallback | None = None,
) -> pa.Table:
    """Generate the full response tree of every item; returns the nodes table (BFS order).

    A node grows its children as soon as its own calls are answered, without waiting for the
    rest of its level: a slow call holds up only its own subtree, and the client's work on one
    answer overlaps the wait for the others.
    """
    roots = [_Node(node_id=f"b{it.batch_index}", item=it, parent=None, round=-1) for it in items]
    semaphore = asyncio.Semaphore(settings.max_concurrent_requests)
    children: dict[str, list[_Node]] = {}

    async def grow(node: _Node, round_: int) -> None:
        if round_ >= settings.protocol.max_message_rounds or node.ended:
            return
        children[node.node_id] = grown = await _node_children(
            node, round_, settings, semaphore, progress
        )
        await asyncio.gather(*(grow(child, round_ + 1) for child in grown))

    await asyncio.gather(*(grow(root, 0) for root in roots))
    return nodes_table(_breadth_first(roots, children))


def _breadth_first(roots: list[_Node], children: Mapping[str, list[_Node]]) -> list[_Node]:
    """Level by level, each level in its parents' order and then the children's index."""
    ordered, level = [], roots
    while level:
        ordered.extend(level)
        level = [child for node in level for child in children.get(node.node_id, ())]
    return ordered


async def _node_children(
    node: _Node,
    round_: int,
    settings: RolloutSettings,
    semaphore: asyncio.Semaphore,
    progress: ProgressCallback | None,
) -> list[_Node]:
    """The node's children in `round_`: one call per active agent (n = k), then k children."""
    protocol, item = settings.protocol, node.item
    active = active_agents(protocol, round_, item.episode_seed)
    k = children_per_node(settings, active)
    if progress is not None:
        progress(round_, len(active), 0)

    async def call(agent: str) -> list[AgentResponse]:
        chat = chat_messages(
            protocol,
            agent,
            settings.agent_params[agent],
            item.datapoint,
            node.turns(),
            round_,
            item.episode_seed,
        )
        async with semaphore:
            responses = await generate_responses(
                settings.clients[agent],
                protocol,
                agent,
                settings.agent_params[agent],
                settings.models[agent],
                chat,
                k,
                round_,
                item.episode_seed,
                call_seed(settings.run_seed, settings.iteration, node.node_id, agent),
                datapoint=item.datapoint,
                early_verdict_retries=settings.early_verdict_retries,
            )
        if progress is not None:
            progress(round_, 0, 1)
        return responses

    results = dict(zip(active, await asyncio.gather(*(call(a) for a in active)), strict=True))
    return [
        _child(node, index, round_, {agent: results[agent][index] for agent in active}, protocol)
        for index in range(k)
    ]


def _child(
    parent: _Node,
    index: int,
    round_: int,
    responses: Mapping[str, AgentResponse],
    protocol: Protocol,
) -> _Node:
    item = parent.item
    raw: dict[str, str] = {}
    messages: list[ChannelMessage] = []
    decision: int | None = None
    failures: list[str] = []
    retries = 0
    for agent, response in responses.items():
        retries += response.retries
        if response.failure is not None:
            failures.append(f"{agent}: {response.failure}")
            continue
        raw[agent] = response.raw
        messages.extend(
            ChannelMessage(agent, channel, content)
            for channel, content in sorted(response.messages.items())
        )
        if response.decision is not None:
            decision = response.decision
    outcome = step_outcome(
        protocol,
        round_,
        decision,
        item.datapoint.y,
        item.datapoint.prover_stance,
        item.episode_seed,
    )
    effective_decision = decision if outcome.decided else None
    # A verdict the protocol did not count (one that ended the episode early) is still the
    # verifier's move: its node must pair with a sibling that asked instead.
    acted = tuple(
        agent
        for agent in responses
        if any(m.agent == agent for m in messages)
        or (agent == protocol.verifier_name and decision is not None)
    )
    return _Node(
        node_id=f"{parent.node_id}.{index}",
        item=item,
        parent=parent,
        round=round_,
        turn=Turn(round=round_, raw=raw, messages=tuple(messages), decision=effective_decision),
        acted=acted,
        ended=outcome.done or outcome.terminated,
        terminated=outcome.terminated,
        step_rewards=dict(outcome.rewards),
        retries=retries,
        failure="; ".join(failures) or None,
    )


def nodes_table(nodes: Sequence[_Node]) -> pa.Table:
    rows = []
    for node in nodes:
        turn = node.turn
        rows.append(
            {
                "datapoint_id": node.item.datapoint.id,
                "batch_index": node.item.batch_index,
                "node_id": node.node_id,
                "parent_id": node.parent.node_id if node.parent else None,
                "round": node.round,
                "messages": [
                    {"agent": m.agent, "channel": m.channel, "content": m.content}
                    for m in (turn.messages if turn else ())
                ],
                "raw_messages": [
                    {"agent": agent, "content": text}
                    for agent, text in (turn.raw.items() if turn else ())
                ],
                "acted": list(node.acted),
                "decision": turn.decision if turn else None,
                "y": node.item.datapoint.y,
                "ended": node.ended,
                "terminated": node.terminated,
                "step_rewards": [
                    {"agent": agent, "reward": float(reward)}
                    for agent, reward in sorted(node.step_rewards.items())
                ],
                "retries": node.retries,
                "failure": node.failure,
            }
        )
    return pa.Table.from_pylist(rows, schema=schemas.NODES)


def batch_table(items: Sequence[BatchItem]) -> pa.Table:
    rows = [
        {
            "batch_index": it.batch_index,
            "datapoint_id": it.datapoint.id,
            "question": it.datapoint.question,
            "solution": it.datapoint.solution,
            "y": it.datapoint.y,
            "prover_stance": it.datapoint.prover_stance,
            "episode_seed": it.episode_seed,
            "other_solution": it.datapoint.other_solution,
        }
        for it in items
    ]
    return pa.Table.from_pylist(rows, schema=schemas.BATCH)


def batch_items(table: pa.Table) -> list[BatchItem]:
    """The batch file's items. A file written before the batch kept `other_solution` (a pair's
    second solution) reads it as None; a protocol that shows pairs then refuses to build its
    prompt (`nip_core.agents.prompts.prompt_variables`) instead of showing an empty one."""
    return [
        BatchItem(
            batch_index=row["batch_index"],
            datapoint=Datapoint(
                id=row["datapoint_id"],
                question=row["question"],
                solution=row["solution"],
                y=row["y"],
                prover_stance=row["prover_stance"],
                other_solution=row.get("other_solution"),
            ),
            episode_seed=row["episode_seed"],
        )
        for row in table.to_pylist()
    ]


def turns_by_node(nodes: pa.Table) -> dict[str, tuple[str | None, Turn | None]]:
    """node id -> (parent id, turn) for rebuilding any node's history from the nodes table."""
    index: dict[str, tuple[str | None, Turn | None]] = {}
    for row in nodes.to_pylist():
        turn = None
        if row["round"] >= 0:
            turn = Turn(
                round=row["round"],
                raw={m["agent"]: m["content"] for m in row["raw_messages"]},
                messages=tuple(
                    ChannelMessage(m["agent"], m["channel"], m["content"]) for m in row["messages"]
                ),
                decision=row["decision"],
            )
        index[row["node_id"]] = (row["parent_id"], turn)
    return index


def path_to_node(index: Mapping[str, tuple[str | None, Turn | None]], node_id: str) -> list[str]:
    """Node ids from the root's first child down to `node_id` (the nodes that hold a turn)."""
    ids: list[str] = []
    current: str | None = node_id
    while current is not None:
        parent, turn = index[current]
        if turn is not None:
            ids.append(current)
        current = parent
    return ids[::-1]


def history(index: Mapping[str, tuple[str | None, Turn | None]], node_id: str) -> list[Turn]:
    """The turns on the path from the root down to `node_id` (inclusive)."""
    return [index[i][1] for i in path_to_node(index, node_id)]
