"""Read a finished (or partly finished) run folder as pandas DataFrames, for people and reports.

    from nip_core.report import read_run
    run = read_run("artifacts/exp1")
    run.stats[["iteration", "verifier.accuracy"]]
    run.pairs(0).query("agent == 'verifier'")
    run.transcript("b3.1.0", iteration=0)

Everything goes through `nip_core.run.artifacts` (checked reads on any fsspec filesystem), so a run on
an object store reads the same as a local one. Nothing here writes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cached_property, lru_cache
from typing import Any

import fsspec
import pandas as pd
import pyarrow as pa
from fsspec.implementations.local import LocalFileSystem

from nip_core.episode import DECISION_NAMES, Turn
from nip_core.malt.evaluation import file_stem
from nip_core.malt.rollout_tree import history, path_to_node, turns_by_node
from nip_core.parameters import convert_hyper_param_dict
from nip_core.run.artifacts import ArtifactError, RunPaths, read_json, read_parquet
from nip_core.run.iteration_files import (
    BATCH_FILE,
    HYPER_PARAMS_FILE,
    ITERATIONS_DIR,
    NODES_FILE,
    PAIRS_FILE,
    REWARDS_FILE,
    dataset_file,
    dataset_folder,
    table_file,
)

TRANSCRIPT_COLUMNS = ["node_id", "round", "agent", "channel", "content", "decision"]


class RunReadError(ArtifactError, LookupError):
    """The run, iteration, group or node asked for is not in the run folder."""


def resolve_run_dir(path: str) -> RunPaths:
    """The run at `path`: a run folder, or an artifacts root holding exactly one run."""
    fs, base = fsspec.core.url_to_fs(str(path))
    if isinstance(fs, LocalFileSystem):
        base = os.path.abspath(base)
    base = base.rstrip("/") or "/"
    if _is_run_dir(fs, base):
        return RunPaths(fs=fs, run_dir=base)
    if not fs.isdir(base):
        raise RunReadError(f"no run folder at {path!r}: the path does not exist")
    runs = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(base, detail=False))
    runs = [name for name in runs if _is_run_dir(fs, f"{base}/{name}")]
    if len(runs) == 1:
        return RunPaths(fs=fs, run_dir=f"{base}/{runs[0]}")
    if runs:
        raise RunReadError(f"{path!r} is an artifacts root with several runs; pick one of {runs}")
    raise RunReadError(
        f"{path!r} is not a run folder (expected {HYPER_PARAMS_FILE} or {ITERATIONS_DIR}/ inside it)"
    )


def _is_run_dir(fs: fsspec.AbstractFileSystem, path: str) -> bool:
    return fs.exists(f"{path}/{HYPER_PARAMS_FILE}") or fs.isdir(f"{path}/{ITERATIONS_DIR}")


def transcript_rows(turns: list[Turn], node_ids: list[str]) -> list[dict[str, Any]]:
    """One row per message of each turn; an agent's text sent on no channel (a bare decision)
    becomes a row with channel None, so a verdict is never lost from the transcript."""
    rows: list[dict[str, Any]] = []
    for node_id, turn in zip(node_ids, turns, strict=True):
        decision = DECISION_NAMES.get(turn.decision) if turn.decision is not None else None
        senders = {m.agent for m in turn.messages}
        for message in turn.messages:
            rows.append(
                {
                    "node_id": node_id,
                    "round": turn.round,
                    "agent": message.agent,
                    "channel": message.channel,
                    "content": message.content,
                    "decision": decision,
                }
            )
        for agent, text in turn.raw.items():
            if agent not in senders:
                rows.append(
                    {
                        "node_id": node_id,
                        "round": turn.round,
                        "agent": agent,
                        "channel": None,
                        "content": text,
                        "decision": decision,
                    }
                )
    return rows


def flatten_stats(manifests: Mapping[int, dict]) -> pd.DataFrame:
    """One row per iteration; nested manifest stats become dotted columns
    (`verifier.accuracy`, `agents.prover.pairs`, `eval.<...>`)."""
    records = [{"iteration": i, **_stats_of(m)} for i, m in sorted(manifests.items())]
    if not records:
        return pd.DataFrame({"iteration": pd.Series([], dtype="int64")})
    frame = pd.json_normalize(records, sep=".")
    return frame.sort_values("iteration").reset_index(drop=True)


def _stats_of(manifest: dict) -> dict:
    """The manifest's stats, with the evaluation stage's metrics under "eval" when the stats
    themselves do not carry them (an evaluation run on its own after the iteration)."""
    stats = dict(manifest.get("stats") or {})
    evaluation = manifest.get("stages", {}).get("evaluate", {}).get("info")
    if evaluation and "eval" not in stats:
        stats["eval"] = evaluation
    return stats


class RunView:
    """Read-only view of one run folder; tables are read lazily and cached."""

    def __init__(self, paths: RunPaths):
        self.paths = paths
        self._table = lru_cache(maxsize=32)(self._read_table)
        self._index = lru_cache(maxsize=8)(self._turn_index)

    def __repr__(self) -> str:
        return f"RunView({self.paths.run_dir!r}, iterations={self.iterations})"

    @property
    def name(self) -> str:
        return self.paths.run_dir.rstrip("/").rsplit("/", 1)[-1]

    @property
    def iterations(self) -> list[int]:
        """Iterations that have a manifest (started), ascending."""
        return self.paths.iterations()

    @cached_property
    def hyper_params(self) -> dict:
        if not self.paths.fs.exists(self.paths.hyper_params):
            raise RunReadError(f"{self.paths.run_dir} has no {HYPER_PARAMS_FILE}")
        stored = read_json(self.paths.fs, self.paths.hyper_params)
        try:  # the same version check and upgrade a resumed run goes through
            return convert_hyper_param_dict(stored)
        except ValueError as e:
            raise RunReadError(f"{self.paths.hyper_params}: {e}") from e

    def manifest(self, iteration: int) -> dict:
        self._check_iteration(iteration)
        return read_json(self.paths.fs, self.paths.manifest(iteration))

    @property
    def stats(self) -> pd.DataFrame:
        """Flattened manifest statistics, one row per iteration (re-read on every access)."""
        return flatten_stats({i: self.manifest(i) for i in self.iterations})

    def batch(self, iteration: int) -> pd.DataFrame:
        return self._frame(iteration, BATCH_FILE, "select-batch")

    def nodes(self, iteration: int) -> pd.DataFrame:
        return self._frame(iteration, NODES_FILE, "generate-rollouts")

    def rewards(self, iteration: int) -> pd.DataFrame:
        return self._frame(iteration, REWARDS_FILE, "estimate-rewards")

    def pairs(self, iteration: int) -> pd.DataFrame:
        return self._frame(iteration, PAIRS_FILE, "select-pairs (none in an EI iteration)")

    def eval(self, iteration: int) -> pd.DataFrame:
        return self._frame(iteration, table_file(file_stem("test")), "test (evaluation)")

    def dpo(self, iteration: int, group: str) -> pd.DataFrame:
        return self._dataset(iteration, "dpo", group)

    def sft(self, iteration: int, group: str) -> pd.DataFrame:
        return self._dataset(iteration, "sft", group)

    def kto(self, iteration: int, group: str) -> pd.DataFrame:
        """A KTO dataset (`pure_text_malt.training_objective: kto`): replies marked against
        their siblings."""
        return self._dataset(iteration, "kto", group)

    def groups(self, iteration: int, kind: str = "dpo") -> list[str]:
        """Model groups with an exported `kind` ("dpo", "kto" or "sft") dataset in this
        iteration."""
        self._check_iteration(iteration)
        folder = self.paths.iteration_file(iteration, dataset_folder(kind))
        if not self.paths.fs.isdir(folder):
            return []
        names = (p.rstrip("/").rsplit("/", 1)[-1] for p in self.paths.fs.ls(folder, detail=False))
        return sorted(n.removesuffix(".parquet") for n in names if n.endswith(".parquet"))

    def transcript(self, node_id: str, iteration: int | None = None) -> pd.DataFrame:
        """The conversation from the root down to `node_id` (default: the latest iteration),
        one row per message: node_id, round, agent, channel, content, decision."""
        if iteration is None:
            if not self.iterations:
                raise RunReadError(f"{self.paths.run_dir} has no iterations yet")
            iteration = self.iterations[-1]
        index = self._index(iteration)
        if node_id not in index:
            roots = sorted(
                (k for k, (parent, _) in index.items() if parent is None), key=lambda k: (len(k), k)
            )
            raise RunReadError(
                f"iteration {iteration} has no node {node_id!r} (node ids look like "
                f"'b<batch index>.<child>...'; roots: {roots[:5]}{'...' if len(roots) > 5 else ''})"
            )
        rows = transcript_rows(history(index, node_id), path_to_node(index, node_id))
        return pd.DataFrame(rows, columns=TRANSCRIPT_COLUMNS)

    # ----------------------------------------------------------------------------------------

    def _check_iteration(self, iteration: int) -> None:
        if iteration not in self.iterations:
            raise RunReadError(
                f"run {self.name!r} has no iteration {iteration}; it has {self.iterations}"
            )

    def _read_table(self, iteration: int, relative: str) -> pa.Table:
        return read_parquet(self.paths.fs, self.paths.iteration_file(iteration, relative))

    def _frame(self, iteration: int, relative: str, stage: str) -> pd.DataFrame:
        self._check_iteration(iteration)
        if not self.paths.fs.exists(self.paths.iteration_file(iteration, relative)):
            raise RunReadError(
                f"iteration {iteration} of run {self.name!r} has no {relative} "
                f"(written by the {stage} stage)"
            )
        return self._table(iteration, relative).to_pandas()

    def _dataset(self, iteration: int, kind: str, group: str) -> pd.DataFrame:
        groups = self.groups(iteration, kind)
        if group not in groups:
            raise RunReadError(
                f"iteration {iteration} has no {kind.upper()} dataset for group {group!r}; "
                f"groups with one: {groups}"
            )
        return self._frame(iteration, dataset_file(kind, group, "parquet"), "export-datasets")

    def _turn_index(self, iteration: int) -> dict[str, tuple[str | None, Turn | None]]:
        self.nodes(iteration)  # clear error when missing
        return turns_by_node(self._table(iteration, NODES_FILE))


def read_run(path: str) -> RunView:
    """A `RunView` of the run folder at `path` (local path or fsspec URL)."""
    return RunView(resolve_run_dir(path))
