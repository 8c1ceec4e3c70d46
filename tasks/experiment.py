"""Stages of an experiment: one arm's iterations with an evaluation after each, and the outputs.

Each arm is an ordinary run folder, so every iteration and every evaluation resumes from its
manifest like any run; `experiment_timings.json` in the arm's folder keeps each iteration's
wall time and training model calls as first measured (a resumed iteration keeps its record).
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
from prefect import task

from nip_core.experiment.report import experiment_html, learning_curves_png
from nip_core.experiment.rows import experiment_rows
from nip_core.experiment.stats import summary_table
from nip_core.malt.evaluation import file_stem
from nip_core.parameters import HyperParameters
from nip_core.run.artifacts import RunPaths, read_json, read_parquet, write_bytes, write_json
from nip_core.run.artifacts import write_parquet as write_arrow
from nip_core.run.iteration_context import build_context
from nip_core.run.iteration_files import NODES_FILE
from nip_core.run.tracking import Tracker, log_evaluation
from tasks.evaluate import evaluate_task

TIMINGS = "experiment_timings.json"


def models_after(paths: RunPaths, iteration: int) -> dict[str, str]:
    """The models iteration `iteration` generates with (those the one before switched to)."""
    if iteration == 0:
        return {}
    return dict(read_json(paths.fs, paths.manifest(iteration - 1)).get("models_after", {}))


def evaluate_iteration(
    paths: RunPaths,
    hp: HyperParameters,
    name: str,
    iteration: int,
    split: str,
    tracker: Tracker | None = None,
) -> dict:
    """Evaluate the models of `iteration` (the base models for 0) on `split`."""
    context = build_context(hp, name, iteration, models_after(paths, iteration))
    metrics = evaluate_task(paths, context, split)
    if tracker is not None:
        log_evaluation(tracker, metrics, iteration)
    return metrics


def evaluation_rows(paths: RunPaths, arm: str, iteration: int, split: str) -> pd.DataFrame:
    """The experiment rows of one finished evaluation."""
    stem = file_stem(split)
    evaluation = read_parquet(paths.fs, paths.iteration_file(iteration, f"{stem}.parquet"))
    nodes = read_parquet(paths.fs, paths.iteration_file(iteration, f"{stem}-nodes.parquet"))
    return experiment_rows(evaluation.to_pandas(), nodes.to_pandas(), arm=arm, iteration=iteration)


def training_model_calls(paths: RunPaths, iteration: int) -> int:
    """Responses sampled for training in an iteration (one per agent turn in its trees)."""
    nodes = read_parquet(paths.fs, paths.iteration_file(iteration, NODES_FILE))
    return int(sum(len(acted) for acted in nodes.column("acted").to_pylist()))


def read_timings(paths: RunPaths) -> dict[str, dict]:
    path = f"{paths.run_dir}/{TIMINGS}"
    return dict(read_json(paths.fs, path)) if paths.fs.exists(path) else {}


def record_timing(paths: RunPaths, iteration: int, seconds: float) -> None:
    """Keep the first measurement of an iteration (a rerun that skips it measures nothing)."""
    timings = read_timings(paths)
    if str(iteration) not in timings:
        timings[str(iteration)] = {
            "wall_seconds": round(seconds, 1),
            "train_model_calls": training_model_calls(paths, iteration),
        }
        write_json(paths.fs, f"{paths.run_dir}/{TIMINGS}", timings)


def timings_table(arm_paths: dict[str, RunPaths]) -> pd.DataFrame:
    """arm, iteration (after training: 1..N), train_model_calls, wall_seconds."""
    rows = [
        {"arm": arm, "iteration": int(it) + 1, **record}
        for arm, paths in arm_paths.items()
        for it, record in read_timings(paths).items()
    ]
    columns = ["arm", "iteration", "train_model_calls", "wall_seconds"]
    return pd.DataFrame(rows, columns=columns)


@task(name="experiment-outputs")
def write_outputs(
    experiment_paths: RunPaths,
    frames: list[pd.DataFrame],
    timings: pd.DataFrame,
    *,
    resamples: int,
    seed: int,
    title: str,
) -> pd.DataFrame:
    """experiment.parquet, summary.parquet, experiment.png and experiment.html; the summary."""
    experiment = pd.concat(frames, ignore_index=True)
    summary = summary_table(experiment, resamples=resamples, seed=seed, timings=timings)
    fs, root = experiment_paths.fs, experiment_paths.run_dir
    write_arrow(
        fs, f"{root}/experiment.parquet", pa.Table.from_pandas(experiment, preserve_index=False)
    )
    write_arrow(fs, f"{root}/summary.parquet", pa.Table.from_pandas(summary, preserve_index=False))
    png = learning_curves_png(summary)
    write_bytes(fs, f"{root}/experiment.png", png)
    write_bytes(fs, f"{root}/experiment.html", experiment_html(summary, png, title).encode())
    return summary
