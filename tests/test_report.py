"""report.html: embedded plots, pair tables and tree drawings; the CLI; a Chromium screenshot.

pytest tests/test_report.py
"""

import base64
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from flows.report import main as report_main
from nip_core.report import read_run
from nip_core.report.html import build_report, pick_trees, value_ranges
from nip_core.report.plots import metric_plots
from nip_core.report.trees import CHOSEN, REJECTED, colour_scale, tree_layout
from tests.test_run_reader import dummy_run  # noqa: F401  (shared session fixture)

REPO = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
IMG = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


@pytest.fixture(scope="module")
def report(dummy_run):  # noqa: F811
    run = read_run(str(dummy_run[1]))
    return run, build_report(run, trees=2)


def test_report_embeds_png_plots_and_needs_no_network(report):
    _, page = report
    images = IMG.findall(page)
    assert len(images) >= 4
    for data in images:
        assert base64.b64decode(data).startswith(PNG_MAGIC)
    assert not re.search(r'(src|href)="(https?:)?//', page), "no external resources"
    assert "<script" not in page


def test_report_tables_show_the_manifest_statistics(report):
    run, page = report
    stats = run.stats
    for agent in ("prover", "verifier"):
        for i in run.iterations:
            pairs = int(stats.loc[i, f"agents.{agent}.pairs"])
            row = f"<tr><td>{i}</td><td>{agent}</td><td>{pairs}</td>"
            assert row in page
    accuracy = stats.loc[1, "verifier.accuracy"]
    assert f"<td>{accuracy:.3f}</td>" in page


def test_report_draws_the_requested_trees_with_pairs_and_hover_text(report):
    run, page = report
    assert 'id="trees"' in page and "Response trees (iteration 1)" in page
    drawn = re.findall(r'<h3 id="tree-b(\d+)">', page)
    nodes, pairs = run.nodes(1), run.pairs(1)
    assert [int(b) for b in drawn] == pick_trees(nodes, pairs, 2)
    assert page.count("<svg") == 2 * 2  # one drawing per agent
    assert CHOSEN in page and REJECTED in page
    tree_ids = set(nodes.loc[nodes["batch_index"] == int(drawn[0]), "node_id"])
    message = next(
        m["content"]
        for msgs in nodes.loc[nodes["node_id"].isin(tree_ids), "messages"]
        for m in msgs
    )
    assert re.search(r"<title>[^<]*" + re.escape(message), page), "node messages on hover"
    chosen = pairs.loc[pairs["parent_node_id"].isin(tree_ids), "chosen_node_id"].iloc[0]
    assert f"<td>{chosen}</td>" in page  # side table keyed by node id


def test_pick_trees_ranks_by_pairs_then_size():
    nodes = pd.DataFrame(
        {
            "batch_index": [0, 0, 0, 1, 1, 2, 2, 2, 2],
            "node_id": ["b0", "b0.0", "b0.1", "b1", "b1.0", "b2", "b2.0", "b2.1", "b2.2"],
        }
    )
    pairs = pd.DataFrame({"parent_node_id": ["b1", "b1", "b0"]})
    assert pick_trees(nodes, pairs, 2) == [1, 0]
    assert pick_trees(nodes, pairs.iloc[:0], 2) == [2, 0]
    assert pick_trees(nodes, pairs, 0) == []


def test_tree_layout_centres_parents_over_children():
    ids = ["b0", "b0.0", "b0.1", "b0.0.0", "b0.0.1", "b0.1.0"]
    parents = [None, "b0", "b0", "b0.0", "b0.0", "b0.1"]
    pos = tree_layout(ids, parents, spacing=10)
    assert [pos[n].x for n in ("b0.0.0", "b0.0.1", "b0.1.0")] == [0, 10, 20]
    assert pos["b0.0"].x == 5 and pos["b0.1"].x == 20
    assert pos["b0"].x == 12.5 and pos["b0"].depth == 0 and pos["b0.1.0"].depth == 2


def test_colours_span_the_agent_range():
    rewards = pd.DataFrame(
        {"agent": ["v", "v", "p", "p"], "node_id": list("abab"), "expected_reward": [-1, 1, 2, 2]}
    )
    ranges = value_ranges(rewards)
    assert ranges == {"v": (-1.0, 1.0), "p": (2.0, 3.0)}
    low, mid, high, clipped = colour_scale([-1, 0, 1, 5], *ranges["v"])
    assert len({low, mid, high}) == 3 and clipped == high


def test_eval_metrics_get_their_own_plot():
    stats = pd.DataFrame(
        {"iteration": [0, 1], "verifier.accuracy": [0.5, 0.6], "agents.v.pairs": [3, 4]}
    )
    titles = [p.title for p in metric_plots(stats)]
    assert "Evaluation on the test split" not in titles
    stats["eval.accuracy"] = [0.4, 0.7]
    assert "Evaluation on the test split" in [p.title for p in metric_plots(stats)]


def test_cli_writes_the_page_and_reports_bad_input(dummy_run, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "sub" / "r.html"
    assert report_main([str(dummy_run[1]), "--out", str(out), "--trees", "1"]) == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count('<h3 id="tree-b') == 1
    assert report_main([str(tmp_path / "nope")]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium is not installed")
def test_screenshot_of_the_report(dummy_run, tmp_path):  # noqa: F811
    from PIL import Image

    page = tmp_path / "report.html"
    assert report_main([str(dummy_run[1]), "--out", str(page), "--trees", "1"]) == 0
    png = tmp_path / "report.png"
    result = subprocess.run(
        [sys.executable, "scripts/screenshot_report.py", str(page), "--out", str(png)]
        + ["--width", "1200", "--height", "1600"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    image = Image.open(png).convert("L")
    assert image.size == (1200, 1600)
    low, high = image.getextrema()
    assert high - low > 100, "the screenshot shows content, not a blank page"


def test_switch_guard_verdicts_get_a_table(report):
    from nip_core.report.html import guard_table, report_html

    run, page = report
    judged = {
        i: run.manifest(i).get("stages", {}).get("switch_guard", {}).get("info") or {}
        for i in run.iterations
    }
    assert any(judged.values()), "the default config guards every switch"
    assert "<h3>Switch guard</h3>" in page  # the dummy run's own verdicts are on its page
    for i, groups in judged.items():
        for group, e in groups.items():
            assert f"<td>{i}</td><td>{group}</td><td>{e['previous_score']:.3f}</td>" in page
    entry = {"previous_score": 0.3125, "new_score": 0.375, "drift": 6.2, "max_drift": 2.0}
    guards = {0: {"prover": {**entry, "verdict": "kept_previous", "reason": "drift"}}, 1: {}}
    table = guard_table(guards)
    assert table.to_dict("records")[0]["reason"] == "drift" and len(table) == 1
    page = report_html(run.name, run.stats, [], "", None, guards=guards)
    assert "<h3>Switch guard</h3>" in page
    assert "<td>prover</td><td>0.312</td><td>0.375</td>" in page
    assert "kept_previous" in page and "<td>drift</td>" in page
