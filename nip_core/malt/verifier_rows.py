"""What the verifier's training rows are: its own sampled pairs (MALT), label pairs (ours), or
both (`pure_text_malt.verifier_training_signal`), and the label balance of its rows.

Label pairs prefer "Decision: <true>" over "Decision: <false>" after a chat the verifier
answered: supervised learning with the labels written into the answers, not MALT. Sampled pairs
and expert-iteration rollouts hold only replies the model sampled; balancing keeps as many of
them from correct as from buggy code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nip_core.agents.prompts import chat_messages, verdict_reply
from nip_core.episode import ACCEPT, REJECT, Turn
from nip_core.malt.dataset_export import (
    ExportContext,
    agent_chat,
    assistant_reply,
    batch_index_by_node,
    dpo_rows,
    guess_replacement_proportion,
    leaf_indices,
)
from nip_core.malt.rollout_tree import BatchItem, history, path_to_node, turns_by_node
from nip_core.malt.tree_values import label_balanced_mask
from nip_core.model_api.chat_format import fold_speaker_names, openai_messages
from nip_core.protocols import is_agent_active, verifier_can_decide
from nip_core.seeding import stable_int


def verifier_signal_rows(
    nodes: pa.Table,
    pairs: pa.Table,
    context: ExportContext,
    agents: Sequence[str],
    malt,
    text_rl,
    run_seed: int,
) -> list[dict]:
    """A MALT group's DPO rows: every agent's sampled sibling pairs, except that the verifier's
    rows are what `malt.verifier_training_signal` names (its sampled pairs, label pairs, or
    both)."""
    verifier = context.protocol.verifier_name
    members = [a for a in agents if a != verifier or malt.trains_on_sampled_verifier_pairs]
    rows = dpo_rows(
        nodes,
        pairs.filter(pc.is_in(pairs.column("agent"), pa.array(members, pa.string()))),
        context,
    )
    if verifier in agents and malt.trains_on_label_pairs:
        labels = guess_replaced_pairs(nodes, context, text_rl, run_seed)
        rows += labels + early_question_pairs(nodes, context, labels)
    return rows


def guess_replaced_pairs(
    nodes: pa.Table, context: ExportContext, text_rl, run_seed: int
) -> list[dict]:
    """MALT's counterpart of nip's guess replacement (ours): for a share of the verifier's
    rollouts (as expert iteration replaces that share), a pair preferring the true verdict
    ("Decision: accept" if y = 1) over the false one after the chat its last reply came from.
    The verifier's reward for a verdict is known without sampling it, so this reaches the
    verdicts a model that nearly always accepts never samples.

    Balanced: DPO's optimum moves the accept-vs-reject log-odds by ln(n_accept/n_reject)/beta,
    so at beta 0.1 a 59:41 label split alone took a verifier to ~97 % accepts (validation).
    One pair per distinct chat (`distinct_verifier_chats`): identical pairs from sibling samples
    are dropped first."""
    verifier = context.protocol.verifier_name
    p = guess_replacement_proportion(text_rl, context.iteration)
    leaves = leaf_indices(nodes)
    if p <= 0 or len(leaves) == 0:
        return []
    rng = np.random.default_rng(stable_int("malt-guess", run_seed, context.iteration, verifier))
    batch_indices = nodes.column("batch_index").to_pylist()
    parent_ids = nodes.column("parent_id").to_pylist()
    prompts = distinct_verifier_chats(nodes, context, leaves)
    truth_of = {
        leaf: ACCEPT if context.items[batch_indices[leaf]].datapoint.y == 1 else REJECT
        for leaf in prompts
    }
    unique = np.array(sorted(truth_of), dtype=np.int64)
    rows = []
    for leaf in balanced_share(unique, truth_of, p, rng):
        item, prompt, truth = context.items[batch_indices[leaf]], prompts[leaf], truth_of[leaf]
        rows.append(
            {
                "openai_prompt": openai_messages(prompt),
                "prompt": fold_speaker_names(prompt),
                "chosen": assistant_reply(verdict_reply(context.protocol, item.datapoint, truth)),
                "rejected": assistant_reply(
                    verdict_reply(
                        context.protocol, item.datapoint, REJECT if truth == ACCEPT else ACCEPT
                    )
                ),
                "iteration": context.iteration,
                "agent": verifier,
                "datapoint_id": item.datapoint.id,
                "parent_node_id": parent_ids[leaf],
                "chosen_node_id": None,
                "rejected_node_id": None,
                "chosen_expected_reward": None,
                "rejected_expected_reward": None,
                "guess_replaced": True,
            }
        )
    return rows


def early_question_pairs(
    nodes: pa.Table, context: ExportContext, label_rows: Sequence[dict]
) -> list[dict]:
    """Under `early_decision_ends_episode`, each label pair's counterpart at the verifier's first
    turn of the same chat: the question it asked there preferred over the verdict the label
    pair prefers later. An early verdict's penalty is known without sampling it, as a counted
    verdict's reward is; trained on label pairs alone, the 135M verifier wrote its verdict in
    every turn and ended every episode early (validation seed 7002). One row per distinct
    first-turn chat."""
    protocol = context.protocol
    if not protocol.early_decision_ends_episode or not label_rows:
        return []
    index = turns_by_node(nodes)
    item_of = batch_index_by_node(nodes)
    seen, rows = set(), []
    for label in label_rows:
        item = context.items[item_of[label["parent_node_id"]]]
        asked = [
            node
            for node in path_to_node(index, label["parent_node_id"])
            if protocol.verifier_name in index[node][1].raw
            and not verifier_can_decide(protocol, index[node][1].round, item.episode_seed)
        ]
        if not asked:
            continue
        chat = agent_chat(context, protocol.verifier_name, item, history(index, asked[0]))
        key = json.dumps(chat[:-1], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        rows.append(
            label
            | {
                "openai_prompt": openai_messages(chat[:-1]),
                "prompt": fold_speaker_names(chat[:-1]),
                "chosen": assistant_reply(chat[-1]["content"]),
                "rejected": label["chosen"],
                "parent_node_id": index[asked[0]][0],
                "chosen_node_id": asked[0],
            }
        )
    return rows


def verdict_turn_prompt(
    context: ExportContext, item: BatchItem, turns: Sequence[Turn]
) -> list[dict] | None:
    """The chat the verifier was shown at the turn its verdict counts in: the episode's last
    round where the verifier acts there (its reply may have failed to parse), else the round
    of its last reply; None where a verdict cannot count in that turn (an early verdict's turn
    under `early_decision_ends_episode`) or the verifier never acted."""
    protocol, verifier = context.protocol, context.protocol.verifier_name
    last = turns[-1].round
    if not is_agent_active(protocol, verifier, last, item.episode_seed):
        spoken = [turn.round for turn in turns if turn.raw.get(verifier)]
        if not spoken:
            return None
        last = spoken[-1]
    if not verifier_can_decide(protocol, last, item.episode_seed):
        return None
    params = context.agent_params[verifier]
    return chat_messages(
        protocol, verifier, params, item.datapoint, turns[:last], last, item.episode_seed
    )


def distinct_verifier_chats(
    nodes: pa.Table, context: ExportContext, leaves: np.ndarray
) -> dict[int, list[dict]]:
    """The first leaf of each distinct chat the verifier was shown at its verdict turn
    (`verdict_turn_prompt`) -> that chat. Siblings sampled from one chat (the solo verifier's
    K answers) would give the same label pair K times: a K-fold step on that problem, not more
    data. A leaf where the verifier's verdict failed to parse still gets its turn's chat; a
    chat that an early verdict ended gets none, since a label pair there would teach the
    verifier to decide where the protocol penalises it."""
    index = turns_by_node(nodes)
    batch_indices = nodes.column("batch_index").to_pylist()
    node_ids = nodes.column("node_id").to_pylist()
    seen, out = set(), {}
    for leaf in leaves.tolist():
        item = context.items[batch_indices[leaf]]
        prompt = verdict_turn_prompt(context, item, history(index, node_ids[leaf]))
        if prompt is None:
            continue
        key = json.dumps(prompt, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out[leaf] = prompt
    return out


def balanced_share(
    leaves: np.ndarray, truth_of: Mapping[int, int], p: float, rng: np.random.Generator
) -> list[int]:
    """Up to half of `p` x len(leaves) random leaves per true verdict, as many of each."""
    shuffled = leaves[rng.permutation(len(leaves))].tolist()
    by_truth = [[leaf for leaf in shuffled if truth_of[leaf] == t] for t in (ACCEPT, REJECT)]
    each = min(int(p * len(leaves)) // 2, *(len(group) for group in by_truth))
    return sorted(leaf for group in by_truth for leaf in group[:each])


def balance_verifier_rollouts(
    rows: Sequence[dict], verifier: str, y_of: Mapping[int, int], seed: int
) -> list[dict]:
    """SFT rows with the verifier's selected rollouts (not its guess-replaced ones) cut to as
    many on correct code as on buggy code (`tree_values.label_balanced_mask`); the rest kept."""
    selected = np.array([r["agent"] == verifier and not r["guess_replaced"] for r in rows], bool)
    y = np.array([y_of[r["datapoint_id"]] for r in rows], dtype=int)
    keep = label_balanced_mask(selected, y, seed)
    return [row for row, kept in zip(rows, keep, strict=True) if kept]
