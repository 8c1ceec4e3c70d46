"""Summary statistics of an iteration, from its nodes, rewards and pairs tables."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from nip_core.episode import ACCEPT


def _safe_ratio(numerator: float, denominator: float) -> float | None:
    return float(numerator / denominator) if denominator else None


def verifier_metrics(decisions: np.ndarray, labels: np.ndarray) -> dict[str, float | None]:
    """Accuracy, precision and recall of final decisions (-1 = no decision, counted wrong).

    Accept is the positive class; precision and recall are None when undefined (not NaN).
    """
    decided = decisions >= 0
    accept = decisions == ACCEPT
    positive = labels == 1
    true_positive = float(np.sum(accept & positive))
    return {
        "accuracy": _safe_ratio(float(np.sum(decided & (decisions == labels))), len(labels)),
        "precision": _safe_ratio(true_positive, float(np.sum(accept))),
        "recall": _safe_ratio(true_positive, float(np.sum(positive))),
        "decision_rate": _safe_ratio(float(np.sum(decided)), len(labels)),
    }


def leaf_decisions(nodes: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(decision or -1, label, round) of every leaf (= every complete rollout)."""
    node_ids = nodes.column("node_id").to_pylist()
    parents = set(nodes.column("parent_id").drop_null().to_pylist())
    is_leaf = np.array([nid not in parents for nid in node_ids], dtype=bool)
    decision = nodes.column("decision").fill_null(-1).to_numpy()
    return (
        decision[is_leaf],
        nodes.column("y").to_numpy()[is_leaf],
        nodes.column("round").to_numpy()[is_leaf],
    )


def iteration_stats(
    nodes: pa.Table,
    rewards: pa.Table,
    pairs: pa.Table | None,
    agent_names: Sequence[str],
) -> dict:
    datapoints = len(set(nodes.column("batch_index").to_pylist()))
    ended = nodes.column("ended").to_numpy(zero_copy_only=False)
    non_terminal = int(np.sum(~ended))
    decisions, labels, rounds = leaf_decisions(nodes)
    a = len(agent_names)
    active = rewards.column("active").to_numpy(zero_copy_only=False).reshape(-1, a)
    value = rewards.column("expected_reward").to_numpy().reshape(-1, a)
    per_agent = {}
    for i, agent in enumerate(agent_names):
        n_pairs = 0
        if pairs is not None:
            n_pairs = int(np.sum(pairs.column("agent").to_numpy(zero_copy_only=False) == agent))
        per_agent[agent] = {
            "active_nodes": int(active[:, i].sum()),
            "pairs": n_pairs,
            "pairs_per_datapoint": _safe_ratio(n_pairs, datapoints),
            "pair_proportion": _safe_ratio(n_pairs, non_terminal),
            "mean_expected_reward": float(value[active[:, i], i].mean())
            if active[:, i].any()
            else None,
        }
    return {
        "datapoints": datapoints,
        "nodes": nodes.num_rows,
        "nodes_per_datapoint": _safe_ratio(nodes.num_rows, datapoints),
        "non_terminal_nodes": non_terminal,
        "rollouts": int(len(labels)),
        "mean_episode_rounds": float(np.mean(rounds + 1)) if len(rounds) else None,
        "failures": int(nodes.column("failure").drop_null().__len__()),
        "verifier": verifier_metrics(decisions, labels),
        "agents": per_agent,
    }
