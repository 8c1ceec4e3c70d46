"""An iteration's statistics as table rows and a markdown summary (shown in the Prefect UI)."""

from __future__ import annotations

from typing import Any

from nip_core.run.artifacts import RunPaths, manifest_stages
from nip_core.run.iteration_context import IterationContext

METRICS = ("accuracy", "precision", "recall")


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
    stages = manifest_stages(paths, iteration)
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
