"""The experiment's picture and page: learning curves with CI bands, and the summary table."""

from __future__ import annotations

import base64
import html
import io

import pandas as pd

PANELS = (
    ("accuracy_when_decided", "Accuracy when decided"),
    ("auc", "AUC of P(accept)"),
    ("accept_rate", "Accept rate (of decided)"),
    ("decision_rate", "Decision rate"),
)
TABLE_COLUMNS = (
    ("scope", "scope", None),
    ("seed", "seed", None),
    ("arm", "arm", None),
    ("iteration", "iteration", None),
    ("accuracy", "accuracy", "accuracy"),
    ("decision_rate", "decision rate", "decision_rate"),
    ("accuracy_when_decided", "accuracy when decided", "accuracy_when_decided"),
    ("balanced_accuracy", "balanced accuracy", "balanced_accuracy"),
    ("accept_rate", "accept rate", "accept_rate"),
    ("auc", "AUC", "auc"),
    ("accept_rate_flagged", "accept rate outside 0.2-0.8", None),
    ("diff_vs_base", "accuracy - base (paired)", "diff"),
    ("decided_diff_vs_base", "decided acc. - base (paired)", "decided_diff"),
    ("train_model_calls", "train model calls", None),
    ("wall_seconds", "wall s", None),
)


def across_seeds(summary: pd.DataFrame) -> pd.DataFrame:
    """The across-seed rows (the whole table when it has no scope column)."""
    if "scope" not in summary:
        return summary
    return summary[summary["scope"] == "across_seeds"]


def learning_curves_png(summary: pd.DataFrame, chance: float = 0.5) -> bytes:
    """One panel per metric over iterations: per arm the across-seed mean with its 95 % CI band
    and each seed as a dot beside it; chance dashed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(4.2 * len(PANELS), 3.8), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(PANELS))
    means = across_seeds(summary)
    seeds = summary[summary["scope"] == "seed"] if "scope" in summary else summary.iloc[:0]
    for ax, (metric, title) in zip(axes, PANELS, strict=True):
        for offset, (arm, rows) in enumerate(means.groupby("arm", sort=False)):
            rows = rows.sort_values("iteration")
            line = ax.plot(rows["iteration"], rows[metric], marker="o", label=str(arm))[0]
            low, high = f"{metric}_ci_low", f"{metric}_ci_high"
            if low in rows and high in rows:
                ax.fill_between(
                    rows["iteration"], rows[low], rows[high], color=line.get_color(), alpha=0.15
                )
            dots = seeds[seeds["arm"] == arm]
            x = dots["iteration"] + 0.04 * (offset + 1)
            ax.scatter(x, dots[metric], s=10, color=line.get_color(), alpha=0.7)
        if metric not in ("decision_rate",):
            ax.axhline(chance, color="grey", linestyle="--", linewidth=1)
        ax.set_title(title)
        ax.set_xlabel("iteration (0 = base model)")
        ax.set_ylim(0, 1)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=7)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _cell(row: pd.Series, column: str, ci: str | None) -> str:
    value = row.get(column)
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return "n/a"
    if ci is None:
        return f"{value:.0f}" if isinstance(value, float) else html.escape(str(value))
    low, high = row.get(f"{ci}_ci_low"), row.get(f"{ci}_ci_high")
    if low is None or pd.isna(low):
        return f"{value:.3f}"
    return f"{value:.3f} <small>[{low:.3f}, {high:.3f}]</small>"


def summary_text(summary: pd.DataFrame) -> str:
    """The across-seed rows as aligned plain text (the command prints it at the end); a
    trailing `!` marks an accept rate outside 0.2-0.8."""
    columns = [
        ("arm", "arm", None),
        ("iteration", "it", None),
        ("seeds", "seeds", None),
        ("decision_rate", "decided", None),
        ("accuracy_when_decided", "acc|decided [95% CI]", "accuracy_when_decided"),
        ("auc", "AUC [95% CI]", "auc"),
        ("accept_rate", "accept", None),
        ("decided_diff_vs_base", "acc|dec - base [95% CI]", "decided_diff"),
    ]
    lines = []
    for _, row in across_seeds(summary).iterrows():
        cells = []
        for column, _, ci in columns:
            text = _cell(row, column, ci).replace("<small>", "").replace("</small>", "")
            if ci is None and column in ("decision_rate", "accept_rate"):
                text = "n/a" if pd.isna(row[column]) else f"{row[column]:.3f}"
            if column == "accept_rate" and bool(row.get("accept_rate_flagged", False)):
                text += " !"
            cells.append(text)
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
<p>Held-out metrics per training iteration (iteration 0 is the base model, shared by every
arm of a seed). Lines: the mean over seeds; dots: each seed. Bands and brackets: 95 % percentile
bootstrap, over datapoints for one seed and over seeds then datapoints across seeds;
differences against the base are paired (same datapoints and episode seeds). AUC reads the
verifier's probability of accepting against the label. The reference arms (always_accept,
always_reject, one_feature_rule fitted on train) score the base model's episodes without any
model; shuffled_labels is trained on permuted labels and must sit at chance. An accept rate
outside 0.2-0.8 is flagged: such a verifier mostly answers one verdict.</p>
{notes}
<img alt="learning curves" src="data:image/png;base64,{image}">
<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
</body></html>
"""


def training_html(training: pd.DataFrame) -> str:
    """The trainer's diagnostics per seed, arm and iteration: did it fit its own rows?"""
    if training.empty:
        return ""
    table = training.round(3).to_html(index=False, na_rep="n/a", border=0)
    return (
        "<h2>Training</h2><p>Per model group and iteration: the rows its dataset export wrote "
        "(examples), what became of its model (switch: switched in, kept_previous by the switch "
        "guard, not_trained, with the reason), the rows its job trained on (job_examples: "
        "every iteration's where it trains on all of them), optimizer steps, loss at the first and last step, "
        "the DPO reward margin and pair accuracy at the last step, tokens per example and how "
        "many examples were longer than the trainer's maximum length (truncated; dropped: left "
        f"out by TRL).</p>{table}"
    )
