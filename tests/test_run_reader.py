"""read_run / RunView on a real two-iteration dummy run, plus the pure helpers.

pytest tests/test_run_reader.py
"""

import shutil

import pandas as pd
import pytest

from nip_core.episode import ChannelMessage, Turn
from nip_core.report import read_run
from nip_core.report.run_reader import RunReadError, RunView, flatten_stats, transcript_rows
from nip_core.run.artifacts import ArtifactError, read_json

DUMMY_RUN = [
    "agents._default.use_dummy_api=true",
    "rl.num_iterations=2",
    "rl.rollouts_per_iteration=4",
]


@pytest.fixture(scope="session")
def dummy_run(prefect_harness, tmp_path_factory):
    """A finished two-iteration run with the dummy backend: (artifacts root, run folder)."""
    from flows.malt_run import malt_run

    root = tmp_path_factory.mktemp("h3-artifacts")
    malt_run(overrides=DUMMY_RUN, run_name="inspect", artifacts_root=str(root))
    return root, root / "inspect"


@pytest.fixture
def run(dummy_run) -> RunView:
    return read_run(str(dummy_run[1]))


def test_iterations_and_tables_match_the_manifests(run, dummy_run):
    assert run.iterations == [0, 1]
    for i in run.iterations:
        manifest = read_json(run.paths.fs, str(dummy_run[1] / f"iterations/{i:04d}/manifest.json"))
        assert run.manifest(i) == manifest
        nodes, rewards, pairs, batch = run.nodes(i), run.rewards(i), run.pairs(i), run.batch(i)
        assert all(isinstance(f, pd.DataFrame) for f in (nodes, rewards, pairs, batch))
        assert len(nodes) == manifest["stats"]["nodes"]
        assert len(batch) == manifest["stats"]["datapoints"]
        assert len(rewards) == len(nodes) * len(manifest["stats"]["agents"])
        assert len(pairs) == manifest["stages"]["pairs"]["info"]["pairs"]
        assert set(pairs["chosen_node_id"]) <= set(nodes["node_id"])


def test_stats_has_one_flat_row_per_iteration(run):
    stats = run.stats
    assert stats["iteration"].tolist() == [0, 1]
    for i in run.iterations:
        manifest_stats = run.manifest(i)["stats"]
        row = stats.set_index("iteration").loc[i]
        assert row["verifier.accuracy"] == pytest.approx(manifest_stats["verifier"]["accuracy"])
        for agent, values in manifest_stats["agents"].items():
            assert row[f"agents.{agent}.pairs"] == values["pairs"]


def test_dpo_datasets_by_group(run):
    groups = run.groups(0, "dpo")
    assert groups, "the dummy run exports DPO datasets"
    info = run.manifest(0)["stages"]["export"]["info"]
    for group in groups:
        dpo = run.dpo(0, group)
        assert len(dpo) == info[group]["rows"]
        assert {"prompt", "chosen", "rejected", "chosen_node_id"} <= set(dpo.columns)
    with pytest.raises(RunReadError, match="no DPO dataset for group 'nobody'"):
        run.dpo(0, "nobody")
    with pytest.raises(RunReadError, match="no SFT dataset"):
        run.sft(0, groups[0])


def test_transcript_follows_the_tree_from_root_to_node(run):
    nodes = run.nodes(0)
    leaf = nodes[nodes["decision"].notna()].sort_values("round").iloc[-1]
    transcript = run.transcript(leaf["node_id"], iteration=0)
    assert list(transcript.columns) == [
        "node_id",
        "round",
        "agent",
        "channel",
        "content",
        "decision",
    ]
    assert transcript["round"].is_monotonic_increasing
    assert transcript["round"].iloc[-1] == leaf["round"]
    path = transcript["node_id"].unique().tolist()
    assert path[-1] == leaf["node_id"]
    assert all(
        child.startswith(parent + ".") for parent, child in zip(path, path[1:], strict=False)
    )
    by_id = nodes.set_index("node_id")
    for row in transcript.itertuples():
        node = by_id.loc[row.node_id]
        texts = [m["content"] for m in node["messages"]] + [
            m["content"] for m in node["raw_messages"]
        ]
        assert row.content in texts
    verdict = transcript["decision"].iloc[-1]
    assert verdict == ("accept" if leaf["decision"] == 1 else "reject")


def test_transcript_defaults_to_the_latest_iteration(run):
    node_id = run.nodes(1)["node_id"].iloc[-1]
    assert run.transcript(node_id).equals(run.transcript(node_id, iteration=1))


def test_clear_errors(run, dummy_run, tmp_path):
    with pytest.raises(RunReadError, match=r"no iteration 7; it has \[0, 1\]"):
        run.nodes(7)
    with pytest.raises(RunReadError, match="no node 'b999'"):
        run.transcript("b999", iteration=0)
    with pytest.raises(RunReadError, match="does not exist"):
        read_run(str(tmp_path / "missing"))
    with pytest.raises(RunReadError, match="not a run folder"):
        read_run(str(tmp_path))
    if "evaluate" not in run.manifest(0)["stages"]:
        with pytest.raises(RunReadError, match="no eval.parquet"):
            run.eval(0)
    assert issubclass(RunReadError, ArtifactError)


def test_root_with_one_run_url_and_root_with_two(dummy_run, tmp_path):
    root, run_dir = dummy_run
    assert read_run(str(root)).name == "inspect"
    assert read_run(f"file://{run_dir}").iterations == [0, 1]
    two = tmp_path / "root"
    shutil.copytree(run_dir, two / "a")
    shutil.copytree(run_dir, two / "b")
    with pytest.raises(RunReadError, match=r"several runs; pick one of \['a', 'b'\]"):
        read_run(str(two))


def test_missing_stage_file_is_named(dummy_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(dummy_run[1], copy)
    (copy / "iterations/0001/pairs.parquet").unlink()
    with pytest.raises(RunReadError, match="no pairs.parquet.*select-pairs"):
        read_run(str(copy)).pairs(1)


def test_transcript_rows_keep_a_bare_verdict():
    turns = [
        Turn(round=0, raw={"verifier": "Q?"}, messages=(ChannelMessage("verifier", "main", "Q?"),)),
        Turn(round=1, raw={"verifier": "Decision: reject"}, decision=0),
    ]
    rows = transcript_rows(turns, ["b0.1", "b0.1.0"])
    assert [(r["channel"], r["content"], r["decision"]) for r in rows] == [
        ("main", "Q?", None),
        (None, "Decision: reject", "reject"),
    ]


def test_flatten_stats_nests_eval_and_falls_back_to_the_evaluate_stage():
    manifests = {
        1: {
            "stats": {"verifier": {"accuracy": 0.5}},
            "stages": {"evaluate": {"info": {"recall": 1}}},
        },
        0: {"stats": {"verifier": {"accuracy": 0.25}, "eval": {"accuracy": 0.75}}, "stages": {}},
    }
    stats = flatten_stats(manifests)
    assert stats["iteration"].tolist() == [0, 1]
    assert stats["verifier.accuracy"].tolist() == [0.25, 0.5]
    assert stats.loc[0, "eval.accuracy"] == 0.75
    assert stats.loc[1, "eval.recall"] == 1
    assert flatten_stats({}).empty
