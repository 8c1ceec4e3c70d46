"""Metric plots over iterations as PNG bytes, from the flattened stats table of a run.

Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot state, no display),
so building a report is safe in threads, in tests and on headless machines.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import pandas as pd

VERIFIER_METRICS = ("accuracy", "precision", "recall", "decision_rate")
AGENT_METRICS = {
    "pairs": "Preference pairs per agent",
    "pair_proportion": "Pair proportion (pairs / non-terminal nodes)",
    "mean_expected_reward": "Mean expected reward (active nodes)",
}
_EVAL_METRIC = re.compile(
    r"^eval\.(.+\.)?(accuracy|precision|recall|decision_rate|accuracy_when_decided"
    r"|balanced_accuracy|accept_rate)$"
)


@dataclass(frozen=True)
class Plot:
    """One embedded figure: a title for the page and its PNG bytes."""

    title: str
    png: bytes


def agent_names(stats: pd.DataFrame) -> list[str]:
    """Agents that appear in the flattened `agents.<name>.<metric>` columns."""
    names = {
        c.split(".")[1] for c in stats.columns if c.startswith("agents.") and c.count(".") == 2
    }
    return sorted(names)


def _series(stats: pd.DataFrame, columns: dict[str, str]) -> dict[str, pd.Series]:
    """label -> numeric series over iterations, for the columns present with any value."""
    found = {}
    for label, column in columns.items():
        if column in stats.columns:
            values = pd.to_numeric(stats[column], errors="coerce")
            if values.notna().any():
                found[label] = values
    return found


def line_plot_png(
    iterations: pd.Series,
    series: dict[str, pd.Series],
    title: str,
    ylabel: str,
    unit_range: bool = False,
) -> bytes:
    """A small line chart (one line per series, markers at every iteration) as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.6, 3.2), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    x = iterations.to_numpy()
    for label, values in series.items():
        axes.plot(x, values.to_numpy(dtype=float), marker="o", linewidth=1.8, label=label)
    axes.set_title(title, fontsize=11)
    axes.set_xlabel("iteration")
    axes.set_ylabel(ylabel)
    axes.set_xticks(x)
    if len(x) == 1:
        axes.set_xlim(x[0] - 0.5, x[0] + 0.5)
    if unit_range:
        axes.set_ylim(-0.03, 1.03)
    axes.grid(alpha=0.3)
    if series:
        axes.legend(fontsize=8, loc="best")
    else:
        axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def metric_plots(stats: pd.DataFrame) -> list[Plot]:
    """The report's figures: verifier metrics, per-agent pair counts, pair proportion, mean
    expected reward, and evaluation metrics when the run has any (`eval.*` columns)."""
    if stats.empty:
        return []
    iterations = stats["iteration"]
    plots = []
    verifier = _series(stats, {m: f"verifier.{m}" for m in VERIFIER_METRICS})
    plots.append(
        Plot(
            "Verifier on training rollouts",
            line_plot_png(iterations, verifier, "Verifier (train rollouts)", "rate", True),
        )
    )
    agents = agent_names(stats)
    for metric, title in AGENT_METRICS.items():
        series = _series(stats, {a: f"agents.{a}.{metric}" for a in agents})
        unit = metric == "pair_proportion"
        plots.append(Plot(title, line_plot_png(iterations, series, title, metric, unit)))
    evaluation = _series(
        stats, {c.removeprefix("eval."): c for c in stats.columns if _EVAL_METRIC.match(c)}
    )
    if evaluation:
        title = "Evaluation on the test split"
        plots.append(Plot(title, line_plot_png(iterations, evaluation, title, "rate", True)))
    return plots
