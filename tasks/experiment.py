"""Stages of an experiment: one arm's iterations with an evaluation after each, and the outputs.

Each arm is an ordinary run folder, so every iteration and every evaluation resumes from its
manifest like any run; `experiment_timings.json` in the arm's folder keeps each iteration's
wall time and training model calls as first measured (a resumed iteration keeps its record).
"""

from __future__ import annotations

import logging

import pandas as pd
import pyarrow as pa
from prefect import task

from nip_core.agents.message_scores import score_replies
from nip_core.data.splits import load_split
from nip_core.experiment.reference import fit_rule, reference_rows
from nip_core.experiment.report import experiment_html, learning_curves_png, training_html
from nip_core.experiment.rows import experiment_rows
from nip_core.experiment.summary import summary_table
from nip_core.experiment.training_diagnostics import ROW_COLUMNS, read_training, training_rows
from nip_core.malt.dataset_export import ExportContext
from nip_core.malt.evaluation import file_stem
from nip_core.malt.verdict_scores import scored_chats, verdict_conversations, verdict_table
from nip_core.parameters import HyperParameters
from nip_core.run.artifacts import RunPaths, read_json, read_parquet, write_bytes, write_json
from nip_core.run.artifacts import write_parquet as write_arrow
from nip_core.run.iteration_context import IterationContext, build_context
from nip_core.run.iteration_files import FINE_TUNE_STEPS_FILE, NODES_FILE
from nip_core.run.stages import run_stage
from nip_core.run.tracking import Tracker, log_evaluation
from tasks.evaluate import evaluate_task, select_items

log = logging.getLogger(__name__)
TIMINGS = "experiment_timings.json"
SEED_FILES = ("rows.parquet", "training.parquet", "timings.parquet")  # a finished seed's outputs


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
    score_verdicts(paths, context, split)
    if tracker is not None:
        log_evaluation(tracker, metrics, iteration)
    return metrics


def score_verdicts(paths: RunPaths, context: IterationContext, split: str) -> dict:
    """`<stem>-verdicts.parquet`: the verifier's P(accept) on each evaluated episode, scored by
    the model it decided with (stage `verdicts-<split>`; p_accept null where the provider
    cannot score)."""
    it, stem = context.iteration, file_stem(split)

    def compute():
        nodes = read_parquet(paths.fs, paths.iteration_file(it, f"{stem}-nodes.parquet"))
        items = {item.batch_index: item for item in select_items(context, split)}
        export = ExportContext(context.protocol, context.agent_params, items, it)
        episodes = verdict_conversations(nodes, export)
        verifier = context.protocol.verifier_name
        params, model = context.agent_params[verifier], context.models[verifier]
        scores = score_replies(params, model, scored_chats(episodes))
        name = f"{stem}-verdicts.parquet"
        table = verdict_table(episodes, scores)
        return {name: write_arrow(paths.fs, paths.iteration_file(it, name), table)}, {
            "scored": scores is not None
        }

    return run_stage(paths, context, f"verdicts-{split}", compute)["info"]


def evaluation_rows(
    paths: RunPaths, arm: str, iteration: int, split: str, seed: int = 0
) -> pd.DataFrame:
    """The experiment rows of one finished evaluation."""
    stem = file_stem(split)
    evaluation = read_parquet(paths.fs, paths.iteration_file(iteration, f"{stem}.parquet"))
    nodes = read_parquet(paths.fs, paths.iteration_file(iteration, f"{stem}-nodes.parquet"))
    verdicts_path = paths.iteration_file(iteration, f"{stem}-verdicts.parquet")
    verdicts = (
        read_parquet(paths.fs, verdicts_path).to_pandas()
        if paths.fs.exists(verdicts_path)
        else None
    )
    return experiment_rows(
        evaluation.to_pandas(),
        nodes.to_pandas(),
        arm=arm,
        iteration=iteration,
        seed=seed,
        verdicts=verdicts,
    )


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


def timings_table(arm_paths: dict[str, RunPaths], seed: int = 0) -> pd.DataFrame:
    """seed, arm, iteration (after training: 1..N), train_model_calls, wall_seconds."""
    rows = [
        {"seed": seed, "arm": arm, "iteration": int(it) + 1, **record}
        for arm, paths in arm_paths.items()
        for it, record in read_timings(paths).items()
    ]
    columns = ["seed", "arm", "iteration", "train_model_calls", "wall_seconds"]
    return pd.DataFrame(rows, columns=columns)


def reference_arm_rows(hp: HyperParameters, base_rows: pd.DataFrame, split: str) -> pd.DataFrame:
    """The reference arms on the base model's episodes; the one-feature rule is fitted on the
    train split (true labels: `hp` is the base configuration)."""
    train = load_split(hp, "train")
    rule = fit_rule(train["solution"], train["y"])
    evaluated = load_split(hp, split)
    solutions = dict(zip(evaluated["id"].astype(int), evaluated["solution"], strict=True))
    log.info(
        "seed %d: one-feature rule fitted on train: %s (train accuracy %.3f)",
        hp.seed,
        rule.describe(),
        rule.train_accuracy,
    )
    return reference_rows(base_rows, solutions, rule)


# A seed's experiment rows, training diagnostics and timings.
SeedResult = tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]


def training_table(arm_paths: dict[str, RunPaths], seed: int, iterations: int) -> pd.DataFrame:
    """Per (arm, iteration after training, group): the trainer's steps and dataset summary
    from the runs' `fine_tune/<group>-steps.parquet` (no rows where no job reported any)."""
    frames = []
    for arm, paths in arm_paths.items():
        for it in range(iterations):
            pattern = paths.iteration_file(it, FINE_TUNE_STEPS_FILE.format(group="*"))
            for path in sorted(paths.fs.glob(pattern)):
                group = path.rsplit("/", 1)[-1].removesuffix("-steps.parquet")
                steps, summary = read_training(paths.fs, path)
                entry = (seed, arm, it + 1, steps, summary)
                frames.append(training_rows([entry]).assign(group=group))
    if not frames:
        return pd.DataFrame(columns=[*ROW_COLUMNS, "group"])
    return pd.concat(frames, ignore_index=True)


def seed_file(experiment_paths: RunPaths, seed: int, name: str) -> str:
    return f"{experiment_paths.run_dir}/seeds/{seed}/{name}"


def finished_seed(experiment_paths: RunPaths, seed: int) -> SeedResult | None:
    """(rows, training, timings) of a seed that finished in an earlier run, else None."""
    fs = experiment_paths.fs
    files = [seed_file(experiment_paths, seed, n) for n in SEED_FILES]
    if not all(fs.exists(f) for f in files):
        return None
    rows, training, timings = (read_parquet(fs, f).to_pandas() for f in files)
    return rows, training, timings


def record_seed(experiment_paths: RunPaths, seed: int, result: SeedResult) -> None:
    """Keep a finished seed's outputs (timings last: their presence marks it done)."""
    for name, frame in zip(SEED_FILES, result, strict=True):
        table = pa.Table.from_pandas(frame, preserve_index=False)
        write_arrow(experiment_paths.fs, seed_file(experiment_paths, seed, name), table)


@task(name="experiment-outputs")
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
    write_arrow(
        fs, f"{root}/experiment.parquet", pa.Table.from_pandas(experiment, preserve_index=False)
    )
    write_arrow(fs, f"{root}/summary.parquet", pa.Table.from_pandas(summary, preserve_index=False))
    write_arrow(
        fs, f"{root}/training.parquet", pa.Table.from_pandas(training, preserve_index=False)
    )
    png = learning_curves_png(summary)
    write_bytes(fs, f"{root}/experiment.png", png)
    page = experiment_html(summary, png, title, training_html(training))
    write_bytes(fs, f"{root}/experiment.html", page.encode())
    return summary
