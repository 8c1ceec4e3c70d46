"""Training diagnostics per experiment arm, from the runs' `fine_tune/<group>-steps.parquet`.

An arm that lands at chance may not have fitted its own training rows at all. Beside the
evaluation, this shows per arm how the trainer went: how many steps, the loss at the first and
last step and its mean over the last epoch, the DPO reward margin and accuracy at the last step
(accuracy: the share of pairs whose chosen answer the model prefers over the rejected one), and
whether examples were cut at the trainer's maximum length. Pure functions of already-read
tables; `read_training` reads one run's file. `epochs` is how far the job trained (the last
step's epoch): fewer than asked where it stopped once fitted (`stop_at_pair_accuracy`).
`examples` and `switch` say, per model group, how many rows its dataset export wrote (a
multi-agent protocol's prover may get none) and what became of its model (`group_outcomes`);
`job_examples`, how many the job trained on: more than `examples` where it trains on every
iteration's rows (`text_rl.fine_tune_on_all_previous_rollouts`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import fsspec
import pandas as pd

from nip_core.training.job_diagnostics import (
    column_end,
    last_epoch_loss,
    read_steps,
    training_summary,
)

# (seed, arm, iteration, steps table, summary: `training` of the fine-tune stage info or None)
TrainingEntry = tuple[int, str, int, pd.DataFrame, dict | None]

ROW_COLUMNS = [
    "seed", "arm", "iteration", "steps", "epochs", "first_loss", "last_loss",
    "last_epoch_loss", "last_margin", "last_accuracy", "tokens_mean", "tokens_max",
    "max_length", "truncated", "dropped", "job_examples",
]  # fmt: skip
# Column -> key of the job's dataset summary (the trainer's view of its rows).
DATASET_COLUMNS = {
    "tokens_max": "tokens_max", "max_length": "max_length", "truncated": "truncated",
    "dropped": "dropped", "tokens_mean": "tokens_mean", "job_examples": "examples",
}  # fmt: skip
# Per model group, from the iteration's manifest (`group_outcomes`).
OUTCOME_COLUMNS = ["group", "examples", "switch", "reason"]


def read_training(fs: fsspec.AbstractFileSystem, path: str) -> tuple[pd.DataFrame, dict | None]:
    """(steps, summary) of one steps file; an empty table and None when the job wrote none."""
    if not fs.exists(path):
        return pd.DataFrame(columns=["step", "loss"]), None
    steps, dataset, _ = read_steps(fs, path)
    return steps, training_summary(steps, dataset)


def _end(steps: pd.DataFrame, column: str, last: bool = True) -> float:
    return _or_nan(column_end(steps, column, last))


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def _number(summary: dict | None, key: str) -> float:
    value = (summary or {}).get(key)
    return float(value) if isinstance(value, int | float) else math.nan


def training_rows(entries: Iterable[TrainingEntry]) -> pd.DataFrame:
    """One row per (seed, arm, iteration): the step values from the steps table, the dataset
    values (tokens, max length, truncated, dropped) from the summary; NaN where a job had none."""
    rows = [
        {
            "seed": seed,
            "arm": arm,
            "iteration": iteration,
            "steps": len(steps),
            "epochs": _end(steps, "epoch"),
            "first_loss": _end(steps, "loss", last=False),
            "last_loss": _end(steps, "loss"),
            "last_epoch_loss": _or_nan(last_epoch_loss(steps)),
            "last_margin": _end(steps, "rewards_margins"),
            "last_accuracy": _end(steps, "rewards_accuracies"),
        }
        | {column: _number(summary, key) for column, key in DATASET_COLUMNS.items()}
        for seed, arm, iteration, steps, summary in entries
    ]
    return pd.DataFrame(rows, columns=ROW_COLUMNS)


def group_outcomes(stages: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per trainable group of one iteration, from its manifest's stages: `examples`, the rows
    its dataset export wrote; `switch`, what became of its model: the switch guard's
    `switched` or `kept_previous`, `switched` where no guard judged a job's model,
    `not_trained` where no job ran (too few rows), "" where the stages do not say; `reason`,
    the guard's or the skip's reason ("" for none). Groups the export did not write are left
    out: runs from before the export recorded its rows."""
    info = lambda stage: (stages.get(stage) or {}).get("info") or {}  # noqa: E731
    export, fine_tune, guard = info("export"), info("fine_tune"), info("switch_guard")
    outcomes = {}
    for group, exported in export.items():
        if not isinstance(exported, Mapping) or "rows" not in exported:
            continue
        job, judged = fine_tune.get(group) or {}, guard.get(group) or {}
        if job.get("skip_reason"):
            switch, reason = "not_trained", job["skip_reason"]
        elif judged.get("verdict"):
            switch, reason = judged["verdict"], judged.get("reason") or ""
        elif job.get("status") == "succeeded":
            switch, reason = "switched", ""
        else:
            switch, reason = "", ""
        outcomes[group] = {"examples": int(exported["rows"]), "switch": switch, "reason": reason}
    return outcomes
