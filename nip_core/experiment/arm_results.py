"""What an experiment reads from its arms' run folders: each evaluation's rows, scored verdicts,
the models an iteration plays with, and the reference arms on the base model's episodes.

Each arm is an ordinary run folder, so every iteration and every evaluation resumes from its
manifest like any run; these functions only add the verifier's P(accept) and read the results.
"""

from __future__ import annotations

import logging

import pandas as pd
import pyarrow as pa

from nip_core.agents.message_scores import score_replies
from nip_core.data.pairwise import writes_disputed_part
from nip_core.data.splits import load_split
from nip_core.experiment.reference import fit_rule, likelihood_rows, reference_rows
from nip_core.experiment.rows import experiment_rows
from nip_core.malt.dataset_export import ExportContext
from nip_core.malt.evaluation import file_stem
from nip_core.malt.verdict_scores import scored_chats, verdict_conversations, verdict_table
from nip_core.parameters import HyperParameters
from nip_core.play.episodes import select_items
from nip_core.run.artifacts import RunPaths, read_parquet, write_parquet
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import likelihoods_file, nodes_file, table_file, verdicts_file
from nip_core.run.stages import run_stage

log = logging.getLogger(__name__)

LIKELIHOOD_SCHEMA = pa.schema(
    [
        ("datapoint_id", pa.int64()),
        ("logprob_first", pa.float64()),
        ("tokens_first", pa.int64()),
        ("logprob_second", pa.float64()),
        ("tokens_second", pa.int64()),
    ]
)


def score_verdicts(
    paths: RunPaths, context: IterationContext, split: str, evaluation_nodes: str
) -> dict:
    """`<stem>-verdicts.parquet`: the verifier's P(accept) on each episode of the evaluation
    whose episodes file is `evaluation_nodes`, scored by the model it decided with (stage
    `verdicts-<split>`; p_accept null where the provider cannot score)."""
    it, stem = context.iteration, file_stem(split)

    def compute():
        nodes = read_parquet(paths.fs, paths.iteration_file(it, evaluation_nodes))
        items = {item.batch_index: item for item in select_items(context, split)}
        export = ExportContext(context.protocol, context.agent_params, items, it)
        episodes = verdict_conversations(nodes, export)
        verifier = context.protocol.verifier_name
        params, model = context.agent_params[verifier], context.models[verifier]
        scores = score_replies(params, model, scored_chats(episodes))
        name = verdicts_file(stem)
        per_token = writes_disputed_part(context.protocol.name)  # versions of unequal length
        table = verdict_table(episodes, scores, per_token=per_token)
        return {name: write_parquet(paths.fs, paths.iteration_file(it, name), table)}, {
            "scored": scores is not None
        }

    return run_stage(paths, context, f"verdicts-{split}", compute)["info"]


def solution_reply(question: str, solution: str) -> list[dict]:
    """A solution as the model's own answer to its question: what the likelihood scores."""
    return [{"role": "user", "content": question}, {"role": "assistant", "content": solution}]


def score_likelihoods(paths: RunPaths, context: IterationContext, split: str) -> dict:
    """`<stem>-likelihoods.parquet` (stage `likelihoods-<split>`): for every pair evaluated on
    `split`, the verifier model's log-probability and token count of Solution A and of Solution
    B, each as the reply to its question; the likelihood baseline picks the one with the higher
    mean per token. Rows are empty where the provider cannot score."""
    it, stem = context.iteration, file_stem(split)

    def compute():
        points = {item.datapoint.id: item.datapoint for item in select_items(context, split)}
        verifier = context.protocol.verifier_name
        params, model = context.agent_params[verifier], context.models[verifier]
        chats = [
            solution_reply(p.question, code)
            for p in points.values()
            for code in (p.solution, p.other_solution or "")
        ]
        scores = score_replies(params, model, chats) or []
        rows = [
            {
                "datapoint_id": point,
                "logprob_first": first[0],
                "tokens_first": first[1],
                "logprob_second": second[0],
                "tokens_second": second[1],
            }
            for point, first, second in zip(points, scores[::2], scores[1::2], strict=False)
        ]
        table = pa.Table.from_pylist(rows, schema=LIKELIHOOD_SCHEMA)
        name = likelihoods_file(stem)
        return {name: write_parquet(paths.fs, paths.iteration_file(it, name), table)}, {
            "scored": bool(rows)
        }

    return run_stage(paths, context, f"likelihoods-{split}", compute)["info"]


def read_likelihoods(paths: RunPaths, split: str) -> pd.DataFrame | None:
    """The base run's solution likelihoods on `split`, None where none were scored."""
    path = paths.iteration_file(0, likelihoods_file(file_stem(split)))
    if not paths.fs.exists(path):
        return None
    frame = read_parquet(paths.fs, path).to_pandas()
    return frame if len(frame) else None


def evaluation_rows(
    paths: RunPaths, arm: str, iteration: int, split: str, seed: int = 0
) -> pd.DataFrame:
    """The experiment rows of one finished evaluation."""
    stem = file_stem(split)
    evaluation = read_parquet(paths.fs, paths.iteration_file(iteration, table_file(stem)))
    nodes = read_parquet(paths.fs, paths.iteration_file(iteration, nodes_file(stem)))
    verdicts_path = paths.iteration_file(iteration, verdicts_file(stem))
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


def shown_code(frame: pd.DataFrame) -> pd.Series:
    """Each datapoint's code as the verifier sees it: its solution, or for a pair of the
    pairwise protocol (Solution A, Solution B)."""
    if "other_solution" not in frame.columns:
        return frame["solution"]
    pairs = zip(frame["solution"], frame["other_solution"], strict=True)
    return pd.Series(list(pairs), index=frame.index)


def reference_arm_rows(
    hp: HyperParameters,
    base_rows: pd.DataFrame,
    split: str,
    likelihoods: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The reference arms on the base model's episodes; the one-feature rule is fitted on the
    train split (true labels: `hp` is the base configuration). With the pairs' `likelihoods`
    (`score_likelihoods`), the likelihood baseline too."""
    train = load_split(hp, "train")
    rule = fit_rule(shown_code(train), train["y"])
    evaluated = load_split(hp, split)
    solutions = dict(zip(evaluated["id"].astype(int), shown_code(evaluated), strict=True))
    log.info(
        "seed %d: one-feature rule fitted on train: %s (train accuracy %.3f)",
        hp.seed,
        rule.describe(),
        rule.train_accuracy,
    )
    rows = reference_rows(base_rows, solutions, rule)
    if likelihoods is None:
        return rows
    return pd.concat([rows, likelihood_rows(base_rows, likelihoods)], ignore_index=True)
