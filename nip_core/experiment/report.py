"""The experiment's picture and page: learning curves with CI bands, and the summary table."""

from __future__ import annotations

import base64
import html
import io

import pandas as pd

PANELS = (
    ("accuracy", "Accuracy (no decision = wrong)"),
    ("accuracy_when_decided", "Accuracy when decided"),
    ("decision_rate", "Decision rate"),
)
TABLE_COLUMNS = (
    ("arm", "arm", None),
    ("iteration", "iteration", None),
    ("accuracy", "accuracy", "accuracy"),
    ("decision_rate", "decision rate", "decision_rate"),
    ("accuracy_when_decided", "accuracy when decided", "accuracy_when_decided"),
    ("balanced_accuracy", "balanced accuracy", "balanced_accuracy"),
    ("accept_rate", "accept rate", "accept_rate"),
    ("diff_vs_base", "accuracy - base (paired)", "diff"),
    ("decided_diff_vs_base", "decided acc. - base (paired)", "decided_diff"),
    ("train_model_calls", "train model calls", None),
    ("wall_seconds", "wall s", None),
)


def learning_curves_png(summary: pd.DataFrame, chance: float = 0.5) -> bytes:
    """Three panels over iterations, one line per arm with its 95 % CI band; chance dashed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 3.8), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(PANELS))
    for ax, (metric, title) in zip(axes, PANELS, strict=True):
        for arm, rows in summary.groupby("arm", sort=False):
            rows = rows.sort_values("iteration")
            line = ax.plot(rows["iteration"], rows[metric], marker="o", label=str(arm))[0]
            low, high = f"{metric}_ci_low", f"{metric}_ci_high"
            if low in rows and high in rows:
                ax.fill_between(
                    rows["iteration"], rows[low], rows[high], color=line.get_color(), alpha=0.15
                )
        if metric != "decision_rate":
            ax.axhline(chance, color="grey", linestyle="--", linewidth=1, label="always accept")
        ax.set_title(title)
        ax.set_xlabel("iteration (0 = base model)")
        ax.set_ylim(0, 1)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _cell(row: pd.Series, column: str, ci: str | None) -> str:
    value = row.get(column)
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "n/a"
    if ci is None:
        return f"{value:.0f}" if isinstance(value, float) else html.escape(str(value))
    low, high = row.get(f"{ci}_ci_low"), row.get(f"{ci}_ci_high")
    if low is None or pd.isna(low):
        return f"{value:.3f}"
    return f"{value:.3f} <small>[{low:.3f}, {high:.3f}]</small>"


def summary_text(summary: pd.DataFrame) -> str:
    """The table as aligned plain text (the command prints it at the end)."""
    columns = [
        ("arm", "arm", None),
        ("iteration", "it", None),
        ("accuracy", "accuracy [95% CI]", "accuracy"),
        ("decision_rate", "decided", None),
        ("accuracy_when_decided", "acc|decided [95% CI]", "accuracy_when_decided"),
        ("diff_vs_base", "acc - base [95% CI]", "diff"),
    ]
    lines = []
    for _, row in summary.iterrows():
        cells = []
        for column, _, ci in columns:
            text = _cell(row, column, ci).replace("<small>", "").replace("</small>", "")
            cells.append(text if ci or column != "decision_rate" else f"{row[column]:.3f}")
        lines.append(cells)
    header = [title for _, title, _ in columns]
    widths = [max(len(x) for x in col) for col in zip(header, *lines, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*cells) for cells in [header, *lines])


def experiment_html(summary: pd.DataFrame, png: bytes, title: str, notes: str = "") -> str:
    """A self-contained page: the curves, then the table (CIs in brackets)."""
    head = "".join(f"<th>{html.escape(name)}</th>" for _, name, _ in TABLE_COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(row, c, ci)}</td>" for c, _, ci in TABLE_COLUMNS) + "</tr>"
        for _, row in summary.iterrows()
    )
    image = base64.b64encode(png).decode()
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}small{{color:#666}}</style>
</head><body>
<h1>{html.escape(title)}</h1>
<p>Held-out accuracy per training iteration (iteration 0 is the base model, shared by every
arm). Bands and brackets: 95 % percentile bootstrap over datapoints; differences against the
base are paired (same datapoints and episode seeds). An episode without a decision counts as
wrong; the splits are balanced, so always accepting scores 0.5.</p>
{notes}
<img alt="learning curves" src="data:image/png;base64,{image}">
<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
</body></html>
"""
