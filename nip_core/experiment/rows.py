"""Per-episode experiment rows from an evaluation's artifacts (`eval.parquet`, its nodes)."""

from __future__ import annotations

import pandas as pd

from nip_core.experiment.stats import EXPERIMENT_COLUMNS


def episode_costs(nodes: pd.DataFrame) -> pd.DataFrame:
    """Per node: model responses and generated words on the path from its root to it.

    `model_calls` counts the responses sampled for the episode (one per agent turn); `tokens`
    counts the whitespace-separated words the agents wrote, a tokenizer-free stand-in for
    generated tokens that is the same for every model provider.
    """
    by_id = nodes.set_index("node_id")
    own_calls = by_id["acted"].map(len)
    own_words = by_id["raw_messages"].map(
        lambda messages: sum(len((m["content"] or "").split()) for m in messages)
    )
    parents = {k: v if isinstance(v, str) else None for k, v in by_id["parent_id"].items()}
    calls, words = {}, {}
    for node_id in by_id.index:  # walk up once per node; trees of an evaluation are chains
        path, current = [], node_id
        while current is not None and current not in calls:
            path.append(current)
            current = parents[current]
        base_calls = calls.get(current, 0) if current is not None else 0
        base_words = words.get(current, 0) if current is not None else 0
        for item in reversed(path):
            base_calls += int(own_calls[item])
            base_words += int(own_words[item])
            calls[item], words[item] = base_calls, base_words
    return pd.DataFrame({"model_calls": pd.Series(calls), "tokens": pd.Series(words)})


def experiment_rows(
    evaluation: pd.DataFrame,
    nodes: pd.DataFrame,
    *,
    arm: str,
    iteration: int,
    seed: int = 0,
    verdicts: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per evaluation episode with the experiment's columns.

    Episodes are numbered per datapoint in batch order (`sample` 0, 1, ...): the evaluation
    repeats the split `samples_per_test_datapoint` times with fresh episode seeds. `verdicts`
    (leaf_node_id, p_accept) gives the verifier's probability of accepting, NaN where absent.
    """
    costs = episode_costs(nodes)
    frame = evaluation.sort_values("batch_index").reset_index(drop=True)
    decision = frame["decision"].astype("Int64")
    p_accept = pd.Series(float("nan"), index=frame.index)
    if verdicts is not None and not verdicts.empty:
        by_leaf = verdicts.set_index("leaf_node_id")["p_accept"].astype(float)
        p_accept = frame["leaf_node_id"].map(by_leaf).astype(float)
    out = pd.DataFrame(
        {
            "seed": seed,
            "arm": arm,
            "iteration": iteration,
            "datapoint_id": frame["datapoint_id"].astype("int64"),
            "sample": frame.groupby("datapoint_id").cumcount().astype("int64"),
            "decision": decision,
            "y": frame["y"].astype("int64"),
            "correct": frame["correct"].astype(bool),
            "decided": decision.notna().to_numpy(),
            "model_calls": costs.loc[frame["leaf_node_id"], "model_calls"].to_numpy(),
            "tokens": costs.loc[frame["leaf_node_id"], "tokens"].to_numpy(),
            "p_accept": p_accept.to_numpy(),
        }
    )
    return out[list(EXPERIMENT_COLUMNS)]
