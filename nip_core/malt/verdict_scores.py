"""The verifier's probability of accepting, read off an evaluated episode without sampling.

After the same conversation the verifier decided in, the served model scores the two verdicts
("Decision: accept" and "Decision: reject"); P(accept) is the softmax of the two
log-probabilities. The verdicts differ in one token, so this is the model's accept-vs-reject odds
at the verdict. In the fill-in protocol the two verdicts are the two versions of the missing part
(`verdict_reply`), compared per token. AUC of this probability against the label shows whether a model ranks correct
code above buggy code even when it answers one verdict every time. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyarrow as pa

from nip_core.agents.prompts import verdict_reply
from nip_core.episode import ACCEPT, REJECT
from nip_core.malt.dataset_export import ExportContext, agent_chat, leaf_indices
from nip_core.malt.rollout_tree import history, turns_by_node
from nip_core.model_api.chat_format import fold_speaker_names

VERDICT_SCHEMA = pa.schema(
    [
        pa.field("leaf_node_id", pa.string(), nullable=False),
        pa.field("datapoint_id", pa.int64(), nullable=False),
        pa.field("p_accept", pa.float64()),  # null: the verifier never spoke, or no scores
    ]
)


def verdict_conversations(
    nodes: pa.Table, context: ExportContext
) -> list[tuple[str, int, list[dict] | None, list[dict] | None]]:
    """(leaf node id, datapoint id, chat ending "Decision: accept", chat ending "Decision:
    reject") per evaluated episode; the chats are None where the verifier never spoke."""
    verifier = context.protocol.verifier_name
    index = turns_by_node(nodes)
    node_ids = nodes.column("node_id").to_pylist()
    batch_indices = nodes.column("batch_index").to_pylist()
    out = []
    for leaf in leaf_indices(nodes).tolist():
        item = context.items[batch_indices[leaf]]
        turns = history(index, node_ids[leaf])
        chat = agent_chat(context, verifier, item, turns)
        accept, reject = (
            None
            if chat is None
            else fold_speaker_names(
                [
                    *chat[:-1],
                    {
                        "role": "assistant",
                        "content": verdict_reply(context.protocol, item.datapoint, v),
                    },
                ]
            )
            for v in (ACCEPT, REJECT)
        )
        out.append((node_ids[leaf], item.datapoint.id, accept, reject))
    return out


def accept_probability(logprob_accept: float, logprob_reject: float) -> float:
    """Softmax over the two verdicts' log-probabilities (stable for any magnitudes)."""
    return 1.0 / (1.0 + math.exp(max(min(logprob_reject - logprob_accept, 700.0), -700.0)))


def pair_accept_probability(
    accept: tuple[float, int], reject: tuple[float, int], per_token: bool = False
) -> float:
    """P(accept) from the (log-probability, tokens) scores of the accept and the reject reply:
    their softmax, summed or (`per_token`) per token."""
    (lp_accept, n_accept), (lp_reject, n_reject) = accept, reject
    if per_token:
        lp_accept, lp_reject = lp_accept / max(n_accept, 1), lp_reject / max(n_reject, 1)
    return accept_probability(lp_accept, lp_reject)


def verdict_table(
    episodes: Sequence[tuple[str, int, list[dict] | None, list[dict] | None]],
    scores: Sequence[tuple[float, int]] | None,
    per_token: bool = False,
) -> pa.Table:
    """One row per episode; `scores` holds (accept, reject) score pairs, in order, for the
    episodes with chats (None: the provider cannot score, every p_accept null).

    `per_token` compares the two replies' mean log-probability per token instead of their sums:
    for the fill-in protocol, whose two verdict replies are versions of the missing part of
    different lengths (the frozen model ranks a question's versions right for 0.848 of medium
    validation questions per token and 0.636 summed, docs/results/probe-line-choice)."""
    scored = iter(scores or [])
    rows = []
    for leaf_id, datapoint_id, accept, reject in episodes:
        p = None
        if scores is not None and accept is not None and reject is not None:
            p = pair_accept_probability(next(scored), next(scored), per_token)
        rows.append({"leaf_node_id": leaf_id, "datapoint_id": datapoint_id, "p_accept": p})
    return pa.Table.from_pylist(rows, schema=VERDICT_SCHEMA)


def scored_chats(
    episodes: Sequence[tuple[str, int, list[dict] | None, list[dict] | None]],
) -> list[list[dict]]:
    """The chats to score, accept then reject per episode that has both."""
    return [
        chat
        for _, _, accept, reject in episodes
        if accept is not None and reject is not None
        for chat in (accept, reject)
    ]
