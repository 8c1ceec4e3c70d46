"""An experiment's own files: iteration timings per arm, a finished seed's outputs, the training
table, and the experiment's tables, curves and page.

`experiment_timings.json` in an arm's folder keeps each iteration's wall time and training
model calls as first measured (a resumed iteration keeps its record); `seeds/<seed>/` keeps a
finished seed's rows, training diagnostics and timings, so a rerun skips the seed.
"""

from __future__ import annotations

import math

import pandas as pd
import pyarrow as pa

from nip_core.experiment.report import experiment_html, learning_curves_png, training_html
from nip_core.experiment.summary import summary_table
from nip_core.experiment.training_diagnostics import (
    OUTCOME_COLUMNS,
    ROW_COLUMNS,
    group_outcomes,
    read_training,
    training_rows,
)
from nip_core.run.artifacts import (
    RunPaths,
    manifest_stages,
    read_json,
    read_parquet,
    write_bytes,
    write_json,
)
from nip_core.run.artifacts import write_parquet as write_arrow
from nip_core.run.iteration_files import (
    EXPERIMENT_FILE,
    EXPERIMENT_HTML,
    EXPERIMENT_PNG,
    EXPERIMENT_TIMINGS_FILE,
    NODES_FILE,
    SEED_FILES,
    SUMMARY_FILE,
    TRAINING_FILE,
    fine_tune_steps,
    seed_folder,
    steps_group,
)

EMPTY_STEPS = pd.DataFrame(columns=["step", "loss"])  # a group that trained no step
# A steps file without its export's record (a run from before the export counted its rows).
UNKNOWN_OUTCOME = {"examples": math.nan, "switch": "", "reason": ""}

# A seed's experiment rows, training diagnostics and timings.
SeedResult = tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]


def training_model_calls(paths: RunPaths, iteration: int) -> int:
    """Responses sampled for training in an iteration (one per agent turn in its trees)."""
    nodes = read_parquet(paths.fs, paths.iteration_file(iteration, NODES_FILE))
    return int(sum(len(acted) for acted in nodes.column("acted").to_pylist()))


def read_timings(paths: RunPaths) -> dict[str, dict]:
    """The arm's recorded timings, iteration (as text) -> record."""
    path = f"{paths.run_dir}/{EXPERIMENT_TIMINGS_FILE}"
    return dict(read_json(paths.fs, path)) if paths.fs.exists(path) else {}


def record_timing(paths: RunPaths, iteration: int, seconds: float) -> None:
    """Keep the first measurement of an iteration (a rerun that skips it measures nothing)."""
    timings = read_timings(paths)
    if str(iteration) not in timings:
        timings[str(iteration)] = {
            "wall_seconds": round(seconds, 1),
            "train_model_calls": training_model_calls(paths, iteration),
        }
        write_json(paths.fs, f"{paths.run_dir}/{EXPERIMENT_TIMINGS_FILE}", timings)


# A seed's timings table: one row per arm and iteration after training.
TIMING_COLUMNS = ["seed", "arm", "iteration", "train_model_calls", "wall_seconds"]


def timings_table(arm_paths: dict[str, RunPaths], seed: int = 0) -> pd.DataFrame:
    """seed, arm, iteration (after training: 1..N), train_model_calls, wall_seconds."""
    rows = [
        {"seed": seed, "arm": arm, "iteration": int(it) + 1, **record}
        for arm, paths in arm_paths.items()
        for it, record in read_timings(paths).items()
    ]
    return pd.DataFrame(rows, columns=TIMING_COLUMNS)


def training_table(arm_paths: dict[str, RunPaths], seed: int, iterations: int) -> pd.DataFrame:
    """Per (arm, iteration after training, model group): the trainer's steps and dataset
    summary from the runs' `fine_tune/<group>-steps.parquet`, the rows the group's export wrote
    and what became of its model (`group_outcomes`). A group that got no job (a prover with no
    pairs) has a row with 0 steps; one the stages know nothing of (no manifest, no steps) none."""
    frames = []
    for arm, paths in arm_paths.items():
        for it in range(iterations):
            outcomes = group_outcomes(manifest_stages(paths, it))
            pattern = paths.iteration_file(it, fine_tune_steps("*"))
            steps_files = {steps_group(p): p for p in sorted(paths.fs.glob(pattern))}
            for group in sorted(outcomes.keys() | steps_files.keys()):
                path = steps_files.get(group)
                steps, summary = read_training(paths.fs, path) if path else (EMPTY_STEPS, None)
                row = training_rows([(seed, arm, it + 1, steps, summary)])
                frames.append(row.assign(group=group, **outcomes.get(group, UNKNOWN_OUTCOME)))
    if not frames:
        return pd.DataFrame(columns=[*ROW_COLUMNS, *OUTCOME_COLUMNS])
    return pd.concat(frames, ignore_index=True)


def seed_file(experiment_paths: RunPaths, seed: int, name: str) -> str:
    """A file of one seed's outputs in the experiment folder."""
    return f"{experiment_paths.run_dir}/{seed_folder(seed)}/{name}"


def finished_seed(
    experiment_paths: RunPaths, seed: int, arm_iterations: dict[str, int] | None = None
) -> SeedResult | None:
    """(rows, training, timings) of a seed that finished in an earlier run, else None; with
    `arm_iterations` (arm -> its iterations), None also when its rows lack one of them (an arm
    added, or the experiment extended by more iterations since)."""
    fs = experiment_paths.fs
    files = [seed_file(experiment_paths, seed, n) for n in SEED_FILES]
    if not all(fs.exists(f) for f in files):
        return None
    rows, training, timings = (read_parquet(fs, f).to_pandas() for f in files)
    if arm_iterations is not None and not rows_cover(rows, arm_iterations):
        return None
    return rows, training, timings


def rows_cover(rows: pd.DataFrame, arm_iterations: dict[str, int]) -> bool:
    """Whether `rows` hold every arm's evaluations after each of its iterations 1..N."""
    held = set(zip(rows["arm"], rows["iteration"], strict=True))
    wanted = {(arm, it) for arm, n in arm_iterations.items() for it in range(1, n + 1)}
    return wanted <= held


def record_seed(experiment_paths: RunPaths, seed: int, result: SeedResult) -> None:
    """Keep a finished seed's outputs (timings last: their presence marks it done)."""
    for name, frame in zip(SEED_FILES, result, strict=True):
        table = pa.Table.from_pandas(frame, preserve_index=False)
        write_arrow(experiment_paths.fs, seed_file(experiment_paths, seed, name), table)


def write_outputs(
    experiment_paths: RunPaths,
    frames: list[pd.DataFrame],
    timings: pd.DataFrame,
    training: pd.DataFrame,
    *,
    resamples: int,
    seed: int,
    title: str,
) -> pd.DataFrame:
    """experiment.parquet, summary.parquet, experiment.png and experiment.html; the summary."""
    experiment = pd.concat(frames, ignore_index=True)
    summary = summary_table(experiment, resamples=resamples, seed=seed, timings=timings)
    fs, root = experiment_paths.fs, experiment_paths.run_dir
    tables = ((EXPERIMENT_FILE, experiment), (SUMMARY_FILE, summary), (TRAINING_FILE, training))
    for name, frame in tables:
        write_arrow(fs, f"{root}/{name}", pa.Table.from_pandas(frame, preserve_index=False))
    png = learning_curves_png(summary)
    write_bytes(fs, f"{root}/{EXPERIMENT_PNG}", png)
    page = experiment_html(summary, png, title, training_html(training))
    write_bytes(fs, f"{root}/{EXPERIMENT_HTML}", page.encode())
    return summary
