"""A self-contained HTML report of a run: metric plots, pair statistics and response trees.

The page needs no network and no JavaScript: plots are PNGs embedded as base64 data URIs, trees
are inline SVG with <title> hover text, and long texts sit in <details> elements. Everything here
is a function from DataFrames to strings; `build_report` only gathers the tables from a RunView.

    python -m flows.report artifacts/exp1 --out report.html --trees 3
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

import pandas as pd

from nip_core.report.plots import Plot, agent_names, metric_plots
from nip_core.report.run_reader import RunReadError, RunView
from nip_core.report.trees import node_text, node_verdict, pair_roles, tree_svg
from nip_core.run.stages import stage_seconds

PAIR_COLUMNS = [
    "pairs",
    "pairs_per_datapoint",
    "pair_proportion",
    "active_nodes",
    "mean_expected_reward",
]
OVERVIEW_COLUMNS = {
    "datapoints": "datapoints",
    "nodes": "nodes",
    "rollouts": "rollouts",
    "mean_episode_rounds": "mean rounds",
    "failures": "failures",
    "verifier.accuracy": "accuracy",
    "verifier.precision": "precision",
    "verifier.recall": "recall",
    "verifier.decision_rate": "decision rate",
}

CSS = """
body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1360px;color:#222;padding:0 16px}
h1{margin-bottom:4px}h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:32px}
.muted{color:#666}.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:12px}
figure{margin:0;border:1px solid #e4e4e4;border-radius:6px;padding:6px;background:#fff}
figure img{width:100%;height:auto}figcaption{font-size:13px;color:#555}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right;vertical-align:top}
th{background:#f4f4f4}td.text,th.text{text-align:left;white-space:pre-wrap;max-width:640px}
.trees{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
.tree{border:1px solid #e4e4e4;border-radius:6px;padding:6px;overflow-x:auto;max-width:100%}
.chosen{color:#1a9641;font-weight:bold}.rejected{color:#d7191c;font-weight:bold}
pre{white-space:pre-wrap;background:#f8f8f8;padding:8px;font-size:12px}
"""


def png_img(plot: Plot) -> str:
    """An <img> with the PNG inline as a data URI (no file, no network)."""
    data = base64.b64encode(plot.png).decode("ascii")
    alt = html.escape(plot.title)
    return (
        f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
        f"<figcaption>{alt}</figcaption></figure>"
    )


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "&ndash;"
    if isinstance(value, float):
        return f"{value:.3f}"
    return html.escape(str(value))


def html_table(frame: pd.DataFrame, text_columns: Sequence[str] = ()) -> str:
    """A plain HTML table; floats to 3 decimals, missing values as a dash, text escaped."""
    text_class = ' class="text"'
    head = "".join(
        f"<th{text_class if c in text_columns else ''}>{html.escape(str(c))}</th>"
        for c in frame.columns
    )
    rows = []
    for record in frame.itertuples(index=False):
        cells = []
        for column, value in zip(frame.columns, record, strict=True):
            css = text_class if column in text_columns else ""
            cells.append(f"<td{css}>{_cell(value)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def overview_table(stats: pd.DataFrame) -> pd.DataFrame:
    """One row per iteration: size of the trees and the verifier's training-rollout metrics."""
    columns = {"iteration": "iteration"} | {
        c: label for c, label in OVERVIEW_COLUMNS.items() if c in stats.columns
    }
    return stats[list(columns)].rename(columns=columns)


def pair_stats_table(stats: pd.DataFrame) -> pd.DataFrame:
    """One row per (iteration, agent) with the pair statistics of the manifest."""
    rows = []
    for record in stats.to_dict("records"):
        for agent in agent_names(stats):
            row = {"iteration": record["iteration"], "agent": agent}
            row |= {m: record.get(f"agents.{agent}.{m}") for m in PAIR_COLUMNS}
            rows.append(row)
    return pd.DataFrame(rows, columns=["iteration", "agent", *PAIR_COLUMNS])


def pick_trees(nodes: pd.DataFrame, pairs: pd.DataFrame, count: int) -> list[int]:
    """Batch indexes of the `count` trees with the most pairs (then the largest, then first)."""
    if count <= 0 or nodes.empty:
        return []
    sizes = nodes.groupby("batch_index").size().rename("nodes")
    node_tree = dict(zip(nodes["node_id"], nodes["batch_index"], strict=True))
    pair_trees = pairs["parent_node_id"].map(node_tree) if not pairs.empty else pd.Series([])
    counts = pair_trees.value_counts().reindex(sizes.index, fill_value=0).rename("pairs")
    ranked = pd.concat([counts, sizes], axis=1).reset_index()
    ranked = ranked.sort_values(["pairs", "nodes", "batch_index"], ascending=[False, False, True])
    return [int(b) for b in ranked["batch_index"].head(count)]


def value_ranges(rewards: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """agent -> (min, max) expected reward over the iteration: one colour scale per agent."""
    ranges = {}
    for agent, values in rewards.groupby("agent")["expected_reward"]:
        low, high = float(values.min()), float(values.max())
        ranges[str(agent)] = (low, high if high > low else low + 1.0)
    return ranges


def expected_by_agent(rewards: pd.DataFrame) -> dict[str, dict[str, float]]:
    """agent -> node id -> expected reward."""
    return {
        str(agent): dict(zip(group["node_id"], group["expected_reward"], strict=True))
        for agent, group in rewards.groupby("agent")
    }


def tree_message_table(
    tree_nodes: pd.DataFrame,
    expected: dict[str, dict[str, float]],
    pairs: pd.DataFrame,
) -> pd.DataFrame:
    """The side table of one tree: per node its messages, verdict, and per agent the expected
    reward and pair role."""
    roles = {agent: pair_roles(pairs, agent) for agent in expected}
    rows = []
    for row in tree_nodes.to_dict("records"):
        nid = row["node_id"]
        entry = {"node": nid, "round": row["round"], "messages": node_text(row) or "(root)"}
        entry["verdict"] = node_verdict(row)
        for agent in expected:
            entry[f"E[{agent}]"] = expected[agent].get(nid)
            entry[f"{agent} pair"] = roles[agent].get(nid)
        rows.append(entry)
    return pd.DataFrame(rows)


def _role_markup(table_html: str) -> str:
    for role in ("chosen", "rejected"):
        table_html = table_html.replace(f"<td>{role}</td>", f'<td class="{role}">{role}</td>')
    return table_html


def tree_section(
    batch_row: dict,
    tree_nodes: pd.DataFrame,
    rewards: pd.DataFrame,
    pairs: pd.DataFrame,
    ranges: dict[str, tuple[float, float]],
) -> str:
    """One datapoint: the problem (collapsed), one drawing per agent, the messages table."""
    b = int(batch_row["batch_index"])
    label = "correct" if batch_row["y"] == 1 else "buggy"
    expected = expected_by_agent(rewards)
    drawings = []
    for agent in sorted(expected):
        svg = tree_svg(
            tree_nodes,
            expected[agent],
            pair_roles(pairs, agent),
            agent,
            ranges[agent],
            f"t{b}-{agent}",
        )
        drawings.append(
            f'<div class="tree"><div class="muted">coloured by {html.escape(agent)}</div>{svg}</div>'
        )
    table = tree_message_table(tree_nodes, expected, pairs)
    return (
        f'<h3 id="tree-b{b}">Tree b{b}: datapoint {batch_row["datapoint_id"]} '
        f'<span class="muted">(solution is {label})</span></h3>'
        f"<details><summary>problem and proposed solution</summary>"
        f"<pre>{html.escape(str(batch_row['question']))}</pre>"
        f"<pre>{html.escape(str(batch_row['solution']))}</pre></details>"
        f'<div class="trees">{"".join(drawings)}</div>'
        f"<details{' open' if len(table) <= 40 else ''}><summary>messages by node "
        f"({len(table)} nodes)</summary>"
        f"{_role_markup(html_table(table, text_columns=['messages']))}</details>"
    )


GUARD_COLUMNS = [
    "previous_score", "new_score", "margin", "previous_logprob_per_token",
    "new_logprob_per_token", "drift", "max_drift", "verdict_share", "max_verdict_share",
    "verdict", "reason",
]  # fmt: skip


def guard_table(guards: dict[int, dict[str, dict]]) -> pd.DataFrame:
    """One row per (iteration, group) the switch guard judged: both scores and the verdict."""
    rows = [
        {"iteration": i, "group": group, **{c: entry.get(c) for c in GUARD_COLUMNS}}
        for i, groups in sorted(guards.items())
        for group, entry in sorted(groups.items())
    ]
    return pd.DataFrame(rows)


TRAINING_COLUMNS = {
    "examples": "examples", "tokens_mean": "tokens/example", "tokens_max": "max tokens",
    "max_length": "max length", "truncated": "truncated", "dropped": "dropped",
    "steps": "steps", "first_loss": "first loss", "last_loss": "last loss",
    "last_epoch_loss": "last-epoch loss", "last_margin": "last margin",
}  # fmt: skip


def _reported(entry: object) -> bool:
    """A job whose events held steps or dataset counts (dummy-engine jobs hold neither)."""
    training = entry.get("training") if isinstance(entry, dict) else None
    return bool(training) and (training.get("steps") or training.get("examples") is not None)


def fine_tune_table(fine_tunes: dict[int, dict[str, dict]]) -> pd.DataFrame:
    """One row per (iteration, group) whose job reported training diagnostics."""
    rows = [
        {"iteration": i, "group": group}
        | {label: entry["training"].get(key) for key, label in TRAINING_COLUMNS.items()}
        for i, groups in sorted(fine_tunes.items())
        for group, entry in sorted(groups.items())
        if _reported(entry)
    ]
    return pd.DataFrame(rows)


def fine_tune_html(fine_tunes: dict[int, dict[str, dict]]) -> str:
    """The "Training" table with its legend, empty when no job reported diagnostics."""
    training = fine_tune_table(fine_tunes)
    if training.empty:
        return ""
    return (
        '<h3>Training</h3><p class="muted">Per fine-tune job: tokens per example (the longest '
        "sequence the trainer builds from it), how many exceed the trainer's maximum length "
        "(and of those, how many it dropped: a DPO prompt alone that fills it), and the loss "
        "and DPO reward margin at the first and last step; per-step values in "
        "<code>fine_tune/&lt;group&gt;-steps.parquet</code>.</p>" + html_table(training)
    )


def report_html(
    run_name: str,
    stats: pd.DataFrame,
    plots: Sequence[Plot],
    trees_html: str,
    tree_iteration: int | None,
    models: dict[int, dict[str, str]] | None = None,
    timings: dict[int, dict[str, float]] | None = None,
    guards: dict[int, dict[str, dict]] | None = None,
    fine_tunes: dict[int, dict[str, dict]] | None = None,
) -> str:
    """Assemble the page from its parts."""
    iterations = stats["iteration"].tolist() if not stats.empty else []
    overview = overview_table(stats) if not stats.empty else pd.DataFrame()
    models_html = ""
    if models:
        frame = pd.DataFrame([{"iteration": i, **groups} for i, groups in sorted(models.items())])
        models_html = "<h3>Models after each iteration</h3>" + html_table(frame)
    if timings:
        frame = pd.DataFrame([{"iteration": i, **s} for i, s in sorted(timings.items())])
        models_html += "<h3>Wall seconds per stage</h3>" + html_table(frame.round(1))
    if guards and any(guards.values()):
        models_html += (
            '<h3>Switch guard</h3><p class="muted">Validation reward of the previous and the '
            "new model, and how far the new model's replies drifted (nats per token, under the "
            "previous model), and the share of the new verifier's decided verdicts that were "
            "one answer (<code>constant_verdict</code>: at or above the maximum on mixed labels); "
            "<code>kept_previous</code> means the new model was not used.</p>"
            + html_table(guard_table(guards))
        )
    models_html += fine_tune_html(fine_tunes or {})
    trees_title = "Response trees" + (
        f" (iteration {tree_iteration})" if tree_iteration is not None else ""
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>MALT run {html.escape(run_name)}</title><style>{CSS}</style></head><body>"
        f"<h1>MALT run <code>{html.escape(run_name)}</code></h1>"
        f'<p class="muted">{len(iterations)} iteration(s): {html.escape(str(iterations))}. '
        "Hover a tree node for its messages.</p>"
        '<p><a href="#metrics">metrics</a> · <a href="#overview">overview</a> · '
        '<a href="#pairs">pair statistics</a> · <a href="#trees">response trees</a></p>'
        '<h2 id="metrics">Metrics over iterations</h2>'
        f'<div class="plots">{"".join(png_img(p) for p in plots)}</div>'
        f'<h2 id="overview">Overview</h2>{html_table(overview)}{models_html}'
        f'<h2 id="pairs">Pair statistics</h2>{html_table(pair_stats_table(stats))}'
        f'<h2 id="trees">{trees_title}</h2>'
        '<p class="muted">Node fill: the agent\'s expected reward. Green solid outline and '
        "\u2713 on the edge: chosen response of a preference pair; red dashed outline and "
        "\u2717: rejected response. Letters: the verifier's verdict (A accept, R reject) or T "
        "(terminated).</p>"
        f"{trees_html or '<p>No trees.</p>'}</body></html>"
    )


def _pairs_or_empty(run: RunView, iteration: int) -> pd.DataFrame:
    try:
        return run.pairs(iteration)
    except RunReadError:  # expert-iteration iterations have no pairs
        return pd.DataFrame(
            columns=["agent", "parent_node_id", "chosen_node_id", "rejected_node_id"]
        )


def build_report(run: RunView, trees: int = 3, iteration: int | None = None) -> str:
    """The report of `run`, drawing `trees` trees of `iteration` (default: the latest one whose
    rewards are written)."""
    stats = run.stats
    models = {i: run.manifest(i).get("models_after") or {} for i in run.iterations}
    models = {i: m for i, m in models.items() if m}
    timings = {i: stage_seconds(run.manifest(i)) for i in run.iterations}
    guards = {
        i: run.manifest(i).get("stages", {}).get("switch_guard", {}).get("info") or {}
        for i in run.iterations
    }
    fine_tunes = {
        i: run.manifest(i).get("stages", {}).get("fine_tune", {}).get("info") or {}
        for i in run.iterations
    }
    if iteration is None:
        done = [i for i in run.iterations if "rewards" in run.manifest(i).get("stages", {})]
        iteration = done[-1] if done else None
    sections = []
    if iteration is not None and trees > 0:
        nodes, rewards = run.nodes(iteration), run.rewards(iteration)
        pairs = _pairs_or_empty(run, iteration)
        batch = run.batch(iteration).set_index("batch_index", drop=False)
        ranges = value_ranges(rewards)
        for b in pick_trees(nodes, pairs, trees):
            tree_nodes = nodes[nodes["batch_index"] == b]
            ids = set(tree_nodes["node_id"])
            sections.append(
                tree_section(
                    batch.loc[b].to_dict(),
                    tree_nodes,
                    rewards[rewards["node_id"].isin(ids)],
                    pairs[pairs["parent_node_id"].isin(ids)],
                    ranges,
                )
            )
    plots = metric_plots(stats)
    return report_html(
        run.name, stats, plots, "".join(sections), iteration, models, timings, guards, fine_tunes
    )
