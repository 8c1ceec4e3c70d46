"""Prefect artifacts of an iteration: a stats table, a markdown summary and a run-folder link.

    publish_iteration_artifacts(paths, context, stats)   # from the flow, after the last stage

Keys are stable per run (`<run>-iteration-table`, `<run>-iteration-summary`, `<run>-run-folder`),
so each iteration adds a version and the Artifacts page shows the history of a run. Building
the table and markdown is pure (tested without Prefect); publishing is a no-op outside a flow or
task run, so the stages stay callable from plain Python.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from nip_core.artifacts import RunPaths, read_json
from nip_core.iteration_context import IterationContext

METRICS = ("accuracy", "precision", "recall")


def artifact_key(run_name: str, suffix: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for this run."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{run_name}-{suffix}".lower()).strip("-")
    return slug or "run"


def in_prefect_run() -> bool:
    """Whether we are inside a Prefect flow or task run (artifacts attach to it)."""
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def _round(value: Any, digits: int = 4) -> Any:
    return round(value, digits) if isinstance(value, float) else value


def eval_metrics(stats: dict) -> dict | None:
    """The test-split verifier metrics in `stats["eval"]`, if the iteration was evaluated."""
    evaluation = stats.get("eval")
    if not isinstance(evaluation, dict) or not evaluation:
        return None
    if "accuracy" in evaluation:
        return evaluation
    nested = evaluation.get("verifier")
    return nested if isinstance(nested, dict) else None


def table_rows(stats: dict, verifier: str = "verifier") -> list[dict]:
    """One row per agent; verifier metrics (train, and test when evaluated) on the verifier's row.

    The metrics judge the verifier's final decisions, so the other agents' rows leave them empty.
    """
    test = eval_metrics(stats)
    rows = []
    for agent, agent_stats in stats["agents"].items():
        row = {
            "agent": agent,
            "nodes": stats["nodes"],
            "active_nodes": agent_stats["active_nodes"],
            "pairs": agent_stats["pairs"],
            "pair_proportion": _round(agent_stats["pair_proportion"]),
            "mean_expected_reward": _round(agent_stats["mean_expected_reward"]),
        }
        is_verifier = agent == verifier
        for metric in METRICS:
            train_value = stats["verifier"].get(metric) if is_verifier else None
            row[f"train_{metric}"] = _round(train_value)
            if test is not None:
                row[f"test_{metric}"] = _round(test.get(metric) if is_verifier else None)
        rows.append(row)
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def iteration_files(paths: RunPaths, iteration: int) -> list[str]:
    """Full paths of the files the iteration's manifest records (shards left out)."""
    manifest_path = paths.manifest(iteration)
    if not paths.fs.exists(manifest_path):
        return []
    stages = read_json(paths.fs, manifest_path).get("stages", {})
    relative = {
        name
        for stage, entry in stages.items()
        if not stage.startswith("rollouts/shard-")
        for name in entry.get("files", {})
    }
    return [paths.iteration_file(iteration, name) for name in sorted(relative)]


def summary_markdown(paths: RunPaths, context: IterationContext, stats: dict) -> str:
    """Markdown: what ran, the key numbers, the fine-tuned models and where the files are."""
    kind = "EI (SFT)" if context.is_ei_iteration else "MALT (DPO)"
    verifier = stats["verifier"]
    lines = [
        f"# {context.run_name}: iteration {context.iteration}",
        "",
        f"{kind} iteration of protocol `{context.protocol.name}`.",
        "",
        "| statistic | value |",
        "|---|---|",
        f"| datapoints | {stats['datapoints']} |",
        f"| nodes | {stats['nodes']} ({_fmt(stats['nodes_per_datapoint'])} per datapoint) |",
        f"| rollouts | {stats['rollouts']} |",
        f"| failures | {stats['failures']} |",
    ]
    lines += [f"| train verifier {m} | {_fmt(verifier.get(m))} |" for m in METRICS]
    test = eval_metrics(stats)
    if test is not None:
        lines += [f"| test verifier {m} | {_fmt(test.get(m))} |" for m in METRICS]
    lines += ["", "## Models after this iteration", ""]
    models = stats.get("models_after") or {}
    lines += [f"- group `{g}`: `{m}`" for g, m in models.items()] or ["- (unchanged)"]
    lines += ["", "## Artifacts", "", f"Run folder: `{paths.run_dir}`", ""]
    lines += [f"- `{path}`" for path in iteration_files(paths, context.iteration)]
    return "\n".join(lines) + "\n"


def run_folder_url(paths: RunPaths) -> str:
    """A link to the run folder: file:// for local paths, the fsspec URL otherwise."""
    if paths.is_local:
        return Path(paths.run_dir).as_uri()
    return paths.fs.unstrip_protocol(paths.run_dir)


def publish_iteration_artifacts(
    paths: RunPaths, context: IterationContext, stats: dict
) -> dict[str, Any]:
    """Create the table, markdown and link artifacts; returns their ids by key ({} outside)."""
    if not in_prefect_run():
        return {}
    from prefect.artifacts import (
        create_link_artifact,
        create_markdown_artifact,
        create_table_artifact,
    )

    run, it = context.run_name, context.iteration
    keys = {
        "table": artifact_key(run, "iteration-table"),
        "summary": artifact_key(run, "iteration-summary"),
        "link": artifact_key(run, "run-folder"),
    }
    return {
        keys["table"]: create_table_artifact(
            table_rows(stats, context.protocol.verifier_name),
            key=keys["table"],
            description=f"{run} iteration {it}: per-agent statistics",
            _sync=True,
        ),
        keys["summary"]: create_markdown_artifact(
            summary_markdown(paths, context, stats),
            key=keys["summary"],
            description=f"{run} iteration {it}: summary",
            _sync=True,
        ),
        keys["link"]: create_link_artifact(
            run_folder_url(paths),
            link_text=paths.run_dir,
            key=keys["link"],
            description=f"{run}: run folder",
            _sync=True,
        ),
    }
