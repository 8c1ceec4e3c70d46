"""Training diagnostics of a finished fine-tune job, read back from the job's events.

Whether a verifier failed to learn because of its data or its trainer shows in the trainer's
own numbers. Our server's training child sends one "dataset" event (tokens per example, the
trainer's max length, how many examples exceed it) and one event per logged step (loss; for
DPO also the chosen and rejected log-probabilities, rewards and margins). After a group's job
succeeded the fine-tune stage writes them to `fine_tune/<group>-steps.parquet`, one row per
step with the dataset event as JSON in the file's metadata, and keeps a compact summary in the
stage info. Jobs without such events (the dummy API, OpenAI's own event shapes) give no file or
an empty table, never an error; a file already written for the job is not fetched again.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from typing import Any

import fsspec
import pandas as pd
import pyarrow as pa

from nip_core.run.artifacts import ArtifactError, RunPaths, read_parquet, write_parquet
from nip_core.run.iteration_files import fine_tune_steps
from nip_core.training.fine_tune_jobs import LOCAL_JOB_IDS, with_backoff

log = logging.getLogger(__name__)

STEP_METRICS = {  # trainer log key -> column of the steps table
    "epoch": "epoch",
    "loss": "loss",
    "learning_rate": "learning_rate",
    "grad_norm": "grad_norm",
    "logps/chosen": "logps_chosen",
    "logps/rejected": "logps_rejected",
    "rewards/chosen": "rewards_chosen",
    "rewards/rejected": "rewards_rejected",
    "rewards/margins": "rewards_margins",
    "rewards/accuracies": "rewards_accuracies",
    "kl": "kl",  # KTO's estimate of the KL term
    "step_seconds": "step_seconds",  # our training child: wall seconds of the step
}
DATASET_KEY, JOB_KEY = "nip_dataset", "nip_job_id"  # metadata of the steps file
PAGE_SIZE = 100


def event_data(event: Any) -> dict | None:
    """An event's `data` as a dict (SDK objects and plain dicts alike), None otherwise."""
    data = event.get("data") if isinstance(event, dict) else getattr(event, "data", None)
    return data if isinstance(data, dict) else None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def steps_table(events: Iterable[Any]) -> pd.DataFrame:
    """One row per step that logged a loss, in step order; a step logged twice keeps its last
    event (`events` oldest first). Columns: step, loss, then the other metrics present."""
    by_step: dict[int, dict] = {}
    for event in events:
        data = event_data(event)
        if data is None or not _is_number(data.get("step")) or not _is_number(data.get("loss")):
            continue  # the dataset event, the end-of-training summary, other providers' shapes
        row = {col: float(data[k]) for k, col in STEP_METRICS.items() if _is_number(data.get(k))}
        by_step[int(data["step"])] = row
    columns = ["loss"] + [c for c in STEP_METRICS.values() if c != "loss"]
    present = [c for c in columns if any(c in row for row in by_step.values())] or ["loss"]
    frame = pd.DataFrame(
        [{"step": step, **row} for step, row in sorted(by_step.items())],
        columns=["step", *present],
    )
    return frame.astype({"step": "int64", **dict.fromkeys(present, "float64")})


def step_seconds(events: Iterable[Any]) -> list[float]:
    """The wall seconds of each timed step, in step order (none where the trainer timed none):
    what the step benchmarks read from a job's events."""
    steps = steps_table(events)
    return steps["step_seconds"].dropna().tolist() if "step_seconds" in steps else []


def dataset_info(events: Iterable[Any]) -> dict | None:
    """The data of the last "dataset" event, None when the job sent none."""
    found = None
    for event in events:
        data = event_data(event)
        if data is not None and data.get("kind") == "dataset":
            found = data
    return found


def _finite(value: Any) -> float | int | None:
    """A JSON-safe number: NaN, infinities and non-numbers become None."""
    if not _is_number(value) or not math.isfinite(value):
        return None
    return value


def last_epoch_loss(steps: pd.DataFrame) -> float | None:
    """The mean loss over the steps of the job's last epoch (every step where the steps hold no
    epoch or the job trained less than one): one step's loss reads a spike as a failed fit."""
    if steps.empty or "loss" not in steps:
        return None
    final = float(steps["epoch"].max()) if "epoch" in steps else math.nan
    if final > 1:  # from the first step past the end of the one before (steps in step order)
        steps = steps.iloc[int((steps["epoch"] > final - 1).to_numpy().argmax()) :]
    losses = steps["loss"].dropna()
    return _finite(float(losses.mean())) if not losses.empty else None


def column_end(steps: pd.DataFrame, column: str, last: bool = True) -> float | None:
    """A steps column's last (or first) recorded value; None where it has none or not a finite
    one."""
    values = steps[column].dropna() if column in steps else pd.Series(dtype=float)
    if values.empty:
        return None
    return _finite(float(values.iloc[-1 if last else 0]))


def training_summary(steps: pd.DataFrame, dataset: dict | None) -> dict[str, Any]:
    """The stage-info summary: dataset size and lengths (`truncated` counts the examples longer
    than the trainer's max length, `dropped` those of them it left out), and how the loss and
    margin ended."""
    dataset = dataset or {}
    sequence = (dataset.get("tokens") or {}).get("sequence") or {}
    examples, kept = _finite(dataset.get("examples")), _finite(dataset.get("kept"))
    return {
        "examples": examples,
        "tokens_mean": _finite(sequence.get("mean")),
        "tokens_max": _finite(sequence.get("max")),
        "max_length": _finite(dataset.get("max_length")),
        "truncated": _finite(dataset.get("truncated")),
        # examples the trainer left out (a DPO prompt alone filling max_length)
        "dropped": examples - kept if examples is not None and kept is not None else None,
        "steps": len(steps),
        "first_loss": column_end(steps, "loss", last=False),
        "last_loss": column_end(steps, "loss", last=True),
        "last_epoch_loss": last_epoch_loss(steps),
        "last_margin": column_end(steps, "rewards_margins", last=True),
    }


async def fetch_events(client: Any, job_id: str, page_size: int = PAGE_SIZE) -> list[Any]:
    """Every event of the job, oldest first (the API pages them newest first)."""
    events: list[Any] = []
    after = None
    while True:
        kwargs = {"limit": page_size} | ({"after": after} if after else {})
        page = await with_backoff(
            lambda kw=kwargs: client.fine_tuning.jobs.list_events(job_id, **kw)
        )
        data = list(page.data or [])
        events.extend(data)
        after = getattr(data[-1], "id", None) if data else None
        if after is None or not getattr(page, "has_more", False):
            break
    return events[::-1]


def write_steps(
    fs: fsspec.AbstractFileSystem, path: str, steps: pd.DataFrame, dataset: dict | None, job: str
) -> None:
    """The steps table, with the dataset event and the job id in its metadata so that the file
    alone gives the summary and tells whether it belongs to the group's current job."""
    table = pa.Table.from_pandas(steps, preserve_index=False)
    write_parquet(fs, path, table, {DATASET_KEY: json.dumps(dataset), JOB_KEY: job})


def read_steps(fs: fsspec.AbstractFileSystem, path: str) -> tuple[pd.DataFrame, dict | None, str]:
    """(steps, dataset event data or None, job id) of a steps file."""
    table = read_parquet(fs, path)
    metadata = table.schema.metadata or {}
    dataset = json.loads(metadata.get(DATASET_KEY.encode(), b"null"))
    job = metadata.get(JOB_KEY.encode(), b"").decode()
    return table.to_pandas(), dataset, job


async def record_training_diagnostics(paths: RunPaths, iteration: int, group: Any) -> dict | None:
    """Write the group's steps file (unless it is there for this job) and return its summary;
    None for jobs that ran nowhere (dummy, frozen, too little data) or events that failed."""
    job_id = group.state.fine_tune_job_id
    if job_id is None or job_id in LOCAL_JOB_IDS or group.client is None:
        return None
    path = paths.iteration_file(iteration, fine_tune_steps(group.name))
    if paths.fs.exists(path):
        try:
            steps, dataset, written_for = read_steps(paths.fs, path)
        except ArtifactError:  # a torn file: fetch again
            written_for = None
        if written_for == job_id:
            return training_summary(steps, dataset)
    import openai

    try:
        events = await fetch_events(group.client, job_id)
    except openai.OpenAIError as exc:  # a diagnostic never fails the stage
        log.warning("group %s: no training diagnostics, events of %s: %r", group.name, job_id, exc)
        return None
    steps, dataset = steps_table(events), dataset_info(events)
    write_steps(paths.fs, path, steps, dataset, job_id)
    return training_summary(steps, dataset)
