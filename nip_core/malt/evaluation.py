"""Evaluation on a held-out split: which datapoints, and what the finished rollouts say.

An evaluation plays every selected datapoint once with one sample per turn (no branching), so
each tree is a single chain and each leaf is one test rollout. Pure: no I/O, no Prefect.

Sizing follows the reference test loop (nip_behaviour §1.4, §4.5): the whole split repeated
`rl.num_test_iterations` times when `text_rl.test_on_whole_dataset`, else
`rl.rollouts_per_iteration × rl.num_test_iterations` datapoints. The same datapoints and episode
seeds are used at every iteration, so metrics move only because the models moved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Literal

import numpy as np
import pyarrow as pa

from nip_core.data.splits import check_split
from nip_core.episode import Datapoint
from nip_core.malt.bootstrap import METRICS, bootstrap, per_datapoint, resample_indices
from nip_core.malt.iteration_stats import leaf_decisions, verifier_metrics
from nip_core.malt.rollout_tree import BatchItem
from nip_core.malt.schemas import AGENT_REWARD
from nip_core.seeding import stable_int

Split = Literal["test", "train", "validation"]
TEST_SCHEMES: tuple[str, ...] = ("none", "all", "last", "first_and_last")

EVAL_SCHEMA = pa.schema(
    [
        pa.field("iteration", pa.int64(), nullable=False),
        pa.field("protocol", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("batch_index", pa.int64(), nullable=False),
        pa.field("datapoint_id", pa.int64(), nullable=False),
        pa.field("leaf_node_id", pa.string(), nullable=False),
        pa.field("y", pa.int64(), nullable=False),
        pa.field("decision", pa.int64()),  # null: the verifier never decided
        pa.field("correct", pa.bool_(), nullable=False),
        pa.field("rounds", pa.int64(), nullable=False),
        pa.field("failure", pa.string()),
        pa.field("episode_rewards", pa.list_(AGENT_REWARD), nullable=False),
    ]
)


def stage_name(split: str) -> str:
    """Manifest stage of an evaluation: "evaluate" on the test split, "evaluate-<split>" else."""
    check_split(split)
    return "evaluate" if split == "test" else f"evaluate-{split}"


def file_stem(split: str) -> str:
    """Artifact stem: `eval` (test split) or `eval-<split>`, so none overwrites another."""
    check_split(split)
    return "eval" if split == "test" else f"eval-{split}"


def should_evaluate(scheme: str, iteration: int, num_iterations: int) -> bool:
    """Whether `text_rl.test_scheme` asks for a test stage inside this iteration."""
    if scheme not in TEST_SCHEMES:
        raise ValueError(f"text_rl.test_scheme must be one of {TEST_SCHEMES}, got {scheme!r}")
    last = iteration == num_iterations - 1
    return (
        scheme == "all"
        or (scheme == "last" and last)
        or (scheme == "first_and_last" and (iteration == 0 or last))
    )


def evaluation_size(
    split_size: int,
    *,
    whole_dataset: bool,
    rollouts_per_iteration: int,
    num_test_iterations: int,
) -> int:
    """Number of evaluation rollouts (datapoints are repeated when it exceeds the split)."""
    if split_size <= 0:
        raise ValueError("the evaluation split is empty (check dataset_options.max_test_size)")
    if num_test_iterations <= 0:
        raise ValueError(f"rl.num_test_iterations must be positive, got {num_test_iterations}")
    per_pass = split_size if whole_dataset else rollouts_per_iteration
    if per_pass <= 0:
        raise ValueError(f"rl.rollouts_per_iteration must be positive, got {per_pass}")
    return per_pass * num_test_iterations


def evaluation_items(
    points: Sequence[Datapoint], count: int, run_seed: int, split: str
) -> list[BatchItem]:
    """`count` items read cyclically from a seeded permutation of `points`.

    Independent of the iteration: every evaluation of a run sees the same datapoints with the
    same episode seeds (common random numbers across iterations).
    """
    check_split(split)
    if not points:
        raise ValueError(f"the {split} split is empty")
    rng = np.random.default_rng(stable_int("evaluation-permutation", run_seed, split))
    order = rng.permutation(len(points))
    return [
        BatchItem(
            batch_index=i,
            datapoint=points[int(order[i % len(points)])],
            episode_seed=stable_int("evaluation-episode", run_seed, split, i, bits=31),
        )
        for i in range(count)
    ]


def label_balanced_items(
    points: Sequence[Datapoint], count: int, run_seed: int, split: str
) -> list[BatchItem]:
    """`count` items of `evaluation_items`' seeded permutation taken alternately from the
    datapoints labelled 1 and 0 (each read cyclically), so that either label makes half of
    them: a guard that judges a verifier on a sample leaning to one label rewards the verdict
    of that label. Falls back to `evaluation_items` when the split holds one label only."""
    ordered = [item.datapoint for item in evaluation_items(points, len(points), run_seed, split)]
    by_label = [[p for p in ordered if p.y == label] for label in (1, 0)]
    items = evaluation_items(points, count, run_seed, split)
    if not all(by_label):
        return items
    return [
        replace(item, datapoint=by_label[i % 2][(i // 2) % len(by_label[i % 2])])
        for i, item in enumerate(items)
    ]


def evaluation_seed(run_seed: int, split: str) -> int:
    """Run seed of the evaluation's model calls, distinct from training's for the same node ids."""
    return stable_int("evaluation-calls", run_seed, split, bits=31)


def _leaf_mask(nodes: pa.Table) -> np.ndarray:
    parents = set(nodes.column("parent_id").drop_null().to_pylist())
    return np.array([nid not in parents for nid in nodes.column("node_id").to_pylist()], bool)


def _path_totals(
    rows: Mapping[str, dict], leaf_id: str, agent_names: Sequence[str]
) -> tuple[dict[str, float], str | None]:
    """(summed step rewards per agent, joined failures) on the path root -> leaf."""
    totals = dict.fromkeys(agent_names, 0.0)
    failures: list[str] = []
    current: str | None = leaf_id
    while current is not None:
        row = rows[current]
        for item in row["step_rewards"]:
            totals[item["agent"]] = totals.get(item["agent"], 0.0) + float(item["reward"])
        if row["failure"]:
            failures.append(row["failure"])
        current = row["parent_id"]
    return totals, "; ".join(reversed(failures)) or None


def evaluation_table(
    nodes: pa.Table,
    agent_names: Sequence[str],
    *,
    iteration: int,
    protocol: str,
    split: str,
) -> pa.Table:
    """One row per finished rollout (= leaf of the nodes table), ordered by batch index."""
    check_split(split)
    decisions, labels, rounds = leaf_decisions(nodes)
    leaf = _leaf_mask(nodes)
    rows = {row["node_id"]: row for row in nodes.to_pylist()}
    leaf_ids = np.asarray(nodes.column("node_id").to_pylist(), dtype=object)[leaf]
    out = []
    for node_id, decision, label, round_ in zip(leaf_ids, decisions, labels, rounds, strict=True):
        totals, failure = _path_totals(rows, node_id, agent_names)
        row = rows[node_id]
        out.append(
            {
                "iteration": iteration,
                "protocol": protocol,
                "split": split,
                "batch_index": row["batch_index"],
                "datapoint_id": row["datapoint_id"],
                "leaf_node_id": node_id,
                "y": int(label),
                "decision": int(decision) if decision >= 0 else None,
                "correct": bool(decision >= 0 and decision == label),
                "rounds": int(round_) + 1,
                "failure": failure,
                "episode_rewards": [{"agent": a, "reward": r} for a, r in totals.items()],
            }
        )
    out.sort(key=lambda r: (r["batch_index"], r["leaf_node_id"]))
    return pa.Table.from_pylist(out, schema=EVAL_SCHEMA)


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if len(values) else None


def evaluation_metrics(table: pa.Table, agent_names: Sequence[str]) -> dict:
    """Verifier accuracy/precision/recall/decision rate, episode length and rewards.

    Uses the same definitions as the training statistics (`verifier_metrics`): no decision
    counts as wrong; precision/recall are None (never NaN) when undefined.
    """
    if table.num_rows == 0:
        raise ValueError("no evaluation rollouts to summarise")
    decisions = table.column("decision").fill_null(-1).to_numpy()
    labels = table.column("y").to_numpy()
    correct = table.column("correct").to_numpy(zero_copy_only=False)
    rewards: dict[str, list[float]] = {a: [] for a in agent_names}
    for episode in table.column("episode_rewards").to_pylist():
        for item in episode:
            rewards.setdefault(item["agent"], []).append(item["reward"])
    return {
        "protocol": table.column("protocol")[0].as_py(),
        "split": table.column("split")[0].as_py(),
        "rollouts": table.num_rows,
        **verifier_metrics(decisions, labels),
        **judging_metrics(table),
        "accuracy_y0": _mean(correct[labels == 0]),
        "accuracy_y1": _mean(correct[labels == 1]),
        "mean_episode_length": _mean(table.column("rounds").to_numpy()),
        "failures": table.num_rows - table.column("failure").null_count,
        "agents": {
            agent: {"mean_episode_reward": _mean(np.asarray(values, dtype=float))}
            for agent, values in rewards.items()
        },
    }


def judging_metrics(table: pa.Table, resamples: int = 1000, seed: int = 0) -> dict:
    """Metrics that separate answering from judging, each with its 95 % bootstrap CI over
    datapoints: accuracy, accuracy when decided, balanced accuracy and accept rate (of the
    decisions). A verifier that always accepts scores 0.5 on a balanced split, yet decides
    every time; decided accuracy against 0.5 is what shows judging."""
    frame = table.select(["datapoint_id", "decision", "y", "correct"]).to_pandas()
    datapoints = np.sort(frame["datapoint_id"].unique())
    sums = per_datapoint(frame, datapoints)
    indices = resample_indices(len(datapoints), resamples, seed)
    out: dict = {}
    for name in ("accuracy", "accuracy_when_decided", "balanced_accuracy", "accept_rate"):
        point, low, high = bootstrap(sums, METRICS[name], indices)
        clean = [None if np.isnan(v) else v for v in (point, low, high)]
        if name != "accuracy":
            out[name] = clean[0]
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = clean[1], clean[2]
    return out


def format_metrics(metrics: Mapping) -> str:
    """One log line per evaluation: the numbers people look at first."""

    def show(value: object) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    return (
        f"{metrics['split']} evaluation ({metrics['protocol']}, {metrics['rollouts']} rollouts): "
        f"accuracy {show(metrics['accuracy'])}, precision {show(metrics['precision'])}, "
        f"recall {show(metrics['recall'])}, decision rate {show(metrics['decision_rate'])}, "
        f"accuracy when decided {show(metrics.get('accuracy_when_decided'))}, "
        f"accept rate {show(metrics.get('accept_rate'))}, "
        f"mean episode length {show(metrics['mean_episode_length'])}"
    )
