"""Training datasets from an iteration's tree: DPO pairs (MALT) and SFT rollouts (expert iteration).

Rows are built per agent and concatenated per shared model group. The Parquet tables are in TRL's
conversational formats (`prompt`/`chosen`/`rejected`, `messages`) with tracing columns; the
JSONL files are the OpenAI fine-tuning shapes of the same rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from nip_core.agents import chat_messages, parse_decision, training_conversation
from nip_core.episode import ACCEPT, REJECT
from nip_core.malt import schemas
from nip_core.malt.rollout_tree import BatchItem, history, turns_by_node
from nip_core.malt.tree_values import parent_indices
from nip_core.model_api.chat_format import fold_speaker_names, openai_messages
from nip_core.protocols import Protocol
from nip_core.seeding import stable_int


@dataclass(frozen=True)
class ExportContext:
    protocol: Protocol
    agent_params: Mapping[str, object]
    items: Mapping[int, BatchItem]  # batch_index -> item
    iteration: int


def assistant_reply(text: str) -> list[dict]:
    """A chat of one assistant message: a DPO answer."""
    return [{"role": "assistant", "content": text}]


def batch_index_by_node(nodes: pa.Table) -> dict[str, int]:
    """node id -> the batch index of its tree (which datapoint and episode seed it belongs to)."""
    return dict(
        zip(
            nodes.column("node_id").to_pylist(),
            nodes.column("batch_index").to_pylist(),
            strict=True,
        )
    )


def _turn_prompt(
    context: ExportContext, index, batch_of: dict[str, int], agent: str, parent: str, node: str
) -> tuple[BatchItem, object, dict]:
    """(item, the turn at `node`, the prompt columns): what `agent` saw when it wrote `node`'s
    reply, the episode up to `parent`."""
    item = context.items[batch_of[parent]]
    _, turn = index[node]
    prompt = chat_messages(
        context.protocol,
        agent,
        context.agent_params[agent],
        item.datapoint,
        history(index, parent),
        turn.round,
        item.episode_seed,
    )
    columns = {"openai_prompt": openai_messages(prompt), "prompt": fold_speaker_names(prompt)}
    return item, turn, columns


def dpo_rows(nodes: pa.Table, pairs: pa.Table, context: ExportContext) -> list[dict]:
    """One row per pair: the agent's view up to the parent, and the two sibling responses."""
    index, batch_of = turns_by_node(nodes), batch_index_by_node(nodes)
    rows = []
    for pair in pairs.to_pylist():
        agent, parent = pair["agent"], pair["parent_node_id"]
        item, chosen_turn, prompt = _turn_prompt(
            context, index, batch_of, agent, parent, pair["chosen_node_id"]
        )
        _, rejected_turn = index[pair["rejected_node_id"]]
        rows.append(
            prompt
            | {
                "chosen": assistant_reply(chosen_turn.raw[agent]),
                "rejected": assistant_reply(rejected_turn.raw[agent]),
                "iteration": context.iteration,
                "agent": agent,
                "datapoint_id": item.datapoint.id,
                "parent_node_id": parent,
                "chosen_node_id": pair["chosen_node_id"],
                "rejected_node_id": pair["rejected_node_id"],
                "chosen_expected_reward": pair["chosen_expected_reward"],
                "rejected_expected_reward": pair["rejected_expected_reward"],
                "guess_replaced": False,
            }
        )
    return rows


def kto_rows(nodes: pa.Table, marked: pa.Table, context: ExportContext) -> list[dict]:
    """One row per marked reply (`group_relative.marked_replies_table`): the agent's view up to
    the parent, the reply it sampled, and whether the reply beat its siblings' mean."""
    index, batch_of = turns_by_node(nodes), batch_index_by_node(nodes)
    rows = []
    for reply in marked.to_pylist():
        agent, parent = reply["agent"], reply["parent_node_id"]
        item, turn, prompt = _turn_prompt(context, index, batch_of, agent, parent, reply["node_id"])
        rows.append(
            prompt
            | {
                "completion": assistant_reply(turn.raw[agent]),
                "label": reply["desirable"],
                "iteration": context.iteration,
                "agent": agent,
                "datapoint_id": item.datapoint.id,
                "parent_node_id": parent,
                "node_id": reply["node_id"],
                "expected_reward": reply["expected_reward"],
                "advantage": reply["advantage"],
            }
        )
    return rows


def agent_chat(
    context: ExportContext, agent: str, item: BatchItem, turns, verdict: int | None = None
) -> list[dict] | None:
    """The episode of `item` from `agent`'s side, ending with its last output (or with
    `verdict` in place of the verifier's); None if the agent never spoke."""
    return training_conversation(
        context.protocol,
        agent,
        context.agent_params[agent],
        item.datapoint,
        turns,
        item.episode_seed,
        replace_verifier_decision_with=verdict,
    )


def alternate_verdicts(rows: Sequence[dict], column: str) -> list[dict]:
    """The rows reordered to alternate those whose `column` (a chat) ends in an "accept" verdict
    with those ending in "reject" (each kept in its order), then the rest. The verdict is
    parsed as the rewards parse it, so a sampled "Decision: Accept." counts as the written
    "Decision: accept" does. Trained in this order (no shuffling), every optimizer step of an
    even number of rows sees both verdicts as often, so no step moves the verifier's bias
    alone."""
    queues: dict[str | None, list[dict]] = {"accept": [], "reject": [], None: []}
    for row in rows:
        queues[parse_decision(row[column][-1].get("content") or "")].append(row)
    accepts, rejects, rest = queues["accept"], queues["reject"], queues[None]
    out = [row for pair in zip(accepts, rejects, strict=False) for row in pair]
    n = min(len(accepts), len(rejects))
    return out + accepts[n:] + rejects[n:] + rest


def episode_rewards(nodes: pa.Table, rewards: pa.Table, agent_names: Sequence[str]) -> np.ndarray:
    """(N, A) sum of step rewards from the root down to each node, level by level."""
    parent = parent_indices(nodes)
    step = rewards.column("reward").to_numpy().reshape(-1, len(agent_names))
    total = step.copy()
    depth = nodes.column("round").to_numpy() + 1
    for level in range(1, int(depth.max(initial=0)) + 1):
        at = np.flatnonzero(depth == level)
        total[at] += total[parent[at]]
    return total


def leaf_indices(nodes: pa.Table) -> np.ndarray:
    parent = parent_indices(nodes)
    has_child = np.zeros(nodes.num_rows, dtype=bool)
    has_child[parent[parent >= 0]] = True
    return np.flatnonzero(~has_child)


def guess_replacement_proportion(text_rl, iteration: int) -> float:
    p0 = text_rl.verifier_guess_replacement_proportion
    rate = text_rl.verifier_guess_replacement_annealing_rate
    if text_rl.verifier_guess_replacement_annealing == "linear":
        return max(p0 - iteration * rate, 0.0)
    if text_rl.verifier_guess_replacement_annealing == "exponential":
        return p0 * (1 - rate) ** iteration
    return p0


def select_rollouts(rewards: np.ndarray, ei, rng: np.random.Generator) -> np.ndarray:
    """Indices (into `rewards`) of the rollouts EI trains on, by threshold or weighted sampling."""
    if ei.rollout_selection_method == "threshold":
        return np.flatnonzero(rewards >= ei.reward_threshold)
    n = len(rewards)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    floor = ei.weighting_minimum if ei.weighting_minimum is not None else rewards.min()
    weights = np.clip(rewards, floor, None) - floor
    total = weights.sum()
    # All-equal rewards would divide by zero in the reference (§8.22): fall back to uniform.
    weights = weights / total if total > 0 else np.full(n, 1.0 / n)
    weights = weights + ei.weighting_epsilon / n
    weights = weights / weights.sum()
    size = int(round(n * ei.weighting_sample_size_factor))
    if not ei.weighting_use_replacement and size > np.count_nonzero(weights):
        raise ValueError(
            f"weighted sampling without replacement cannot draw {size} of {n} rollouts "
            f"({np.count_nonzero(weights)} with non-zero weight); lower "
            "weighting_sample_size_factor, raise weighting_epsilon or set "
            "weighting_use_replacement"
        )
    return np.sort(rng.choice(n, size=size, replace=ei.weighting_use_replacement, p=weights))


def sft_rows(
    nodes: pa.Table,
    rewards: pa.Table,
    context: ExportContext,
    agents: Sequence[str],
    agent_names: Sequence[str],
    ei,
    text_rl,
    run_seed: int,
) -> list[dict]:
    """Expert-iteration rows: selected whole rollouts per agent, plus guess-replaced ones."""
    index = turns_by_node(nodes)
    totals = episode_rewards(nodes, rewards, agent_names)
    leaves = leaf_indices(nodes)
    node_ids = nodes.column("node_id").to_pylist()
    batch_indices = nodes.column("batch_index").to_pylist()
    rows = []
    for agent in agents:
        a = list(agent_names).index(agent)
        rng = np.random.default_rng(stable_int("ei", run_seed, context.iteration, agent))
        candidates = leaves
        replaced = np.zeros(0, dtype=np.int64)
        if agent == context.protocol.verifier_name:
            order = rng.permutation(len(leaves))
            p = guess_replacement_proportion(text_rl, context.iteration)
            cut = int(p * len(leaves))
            replaced, candidates = leaves[order[:cut]], leaves[np.sort(order[cut:])]
        chosen = candidates[select_rollouts(totals[candidates, a], ei, rng)]
        for leaf, guess in [(i, False) for i in chosen] + [(i, True) for i in replaced]:
            item = context.items[batch_indices[leaf]]
            label = (ACCEPT if item.datapoint.y == 1 else REJECT) if guess else None
            conversation = agent_chat(context, agent, item, history(index, node_ids[leaf]), label)
            if conversation is None:
                continue
            rows.append(
                {
                    "openai_messages": openai_messages(conversation),
                    "messages": fold_speaker_names(conversation),
                    "iteration": context.iteration,
                    "agent": agent,
                    "datapoint_id": item.datapoint.id,
                    "leaf_node_id": node_ids[leaf],
                    "episode_reward": float(totals[leaf, a]),
                    "guess_replaced": guess,
                }
            )
    return rows


def last_replies(
    nodes: pa.Table, context: ExportContext, agents: Sequence[str]
) -> dict[str, list[list[dict]]]:
    """Per agent, each episode's chat ending with the agent's last reply (leaf order)."""
    index = turns_by_node(nodes)
    node_ids = nodes.column("node_id").to_pylist()
    batch_indices = nodes.column("batch_index").to_pylist()
    replies: dict[str, list[list[dict]]] = {agent: [] for agent in agents}
    for leaf in leaf_indices(nodes):
        item = context.items[batch_indices[leaf]]
        turns = history(index, node_ids[leaf])
        for agent in agents:
            conversation = agent_chat(context, agent, item, turns)
            if conversation is not None:
                replies[agent].append(fold_speaker_names(conversation))
    return replies


def dpo_table(rows: Sequence[dict]) -> pa.Table:
    return pa.Table.from_pylist([_without(r, "openai_prompt") for r in rows], schema=schemas.DPO)


def kto_table(rows: Sequence[dict]) -> pa.Table:
    return pa.Table.from_pylist([_without(r, "openai_prompt") for r in rows], schema=schemas.KTO)


def kto_openai_jsonl(rows: Sequence[dict]) -> list[dict]:
    """Our server's KTO lines (the OpenAI API has none): the prompt, the answer, its label."""
    return [
        {"input": {"messages": r["openai_prompt"]}, "output": r["completion"], "label": r["label"]}
        for r in rows
    ]


def sft_table(rows: Sequence[dict]) -> pa.Table:
    return pa.Table.from_pylist([_without(r, "openai_messages") for r in rows], schema=schemas.SFT)


def dpo_openai_jsonl(rows: Sequence[dict]) -> list[dict]:
    return [
        {
            "input": {"messages": r["openai_prompt"]},
            "preferred_output": r["chosen"],
            "non_preferred_output": r["rejected"],
        }
        for r in rows
    ]


def sft_openai_jsonl(rows: Sequence[dict]) -> list[dict]:
    return [{"messages": r["openai_messages"]} for r in rows]


def _without(row: dict, key: str) -> dict:
    return {k: v for k, v in row.items() if k != key}


def training_datasets(
    exports: Mapping[int, Mapping[str, Mapping]],
    group: str,
    iteration: int,
    all_previous: bool,
) -> list[tuple[int, Mapping]]:
    """(iteration, export info) of every dataset a group's job at `iteration` trains on.

    Normally just this iteration's. With `text_rl.fine_tune_on_all_previous_rollouts`, the
    datasets of every iteration so far of the same kind (DPO or SFT: a MALT job after initial
    EI iterations trains on the DPO ones), oldest first; the job then starts from the base
    model, so each iteration's model is trained once on everything seen so far.
    """
    current = exports.get(iteration, {}).get(group)
    if current is None:
        return []
    if not all_previous:
        return [(iteration, current)]
    return [
        (it, exports[it][group])
        for it in sorted(exports)
        if it <= iteration
        and group in exports[it]
        and exports[it][group]["kind"] == current["kind"]
        and exports[it][group].get("jsonl")
    ]
