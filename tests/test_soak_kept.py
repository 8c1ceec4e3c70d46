"""The vLLM kill soak's checks (`bench/soak_kept.py`): what a resumed run must keep, and the
reference's shape; each shown to fail on the fault it exists for."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.soak_kept import kept, same_shape, snapshot


def iteration(folder: Path, rows: int = 2) -> Path:
    """A hand-made iteration folder: a Parquet table, a call journal, a manifest, a temp file."""
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"x": list(range(rows))}), folder / "nodes.parquet")
    (folder / "calls-0.jsonl").write_text('{"key": "k1", "texts": ["a"]}\n')
    manifest = {"stages": {"rollouts": {"seconds": 1.0, "info": {"calls": 1}}}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / ".tmp-abc-pairs.parquet").write_bytes(b"half")
    return folder


def test_a_run_that_only_added_after_the_kill_kept_everything(tmp_path: Path) -> None:
    run = iteration(tmp_path / "run")
    before = snapshot(run)
    assert ".tmp-abc-pairs.parquet" not in before  # a half-written file is no finished file
    with (run / "calls-0.jsonl").open("a") as journal:  # journals grow
        journal.write('{"key": "k2", "texts": ["b"]}\n')
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["stages"]["rewards"] = {"seconds": 0.1, "info": {}}  # so does the manifest
    (run / "manifest.json").write_text(json.dumps(manifest))
    pq.write_table(pa.table({"y": [1]}), run / "pairs.parquet")  # and new files come
    assert kept(before, run) == []


def test_rewritten_lost_and_redone_files_are_named(tmp_path: Path) -> None:
    run = iteration(tmp_path / "run")
    before = snapshot(run)
    pq.write_table(pa.table({"x": [5, 6]}), run / "nodes.parquet")  # a stage redone
    (run / "calls-0.jsonl").write_text('{"key": "k9", "texts": ["z"]}\n')  # a record lost
    manifest = {"stages": {"rollouts": {"seconds": 2.0, "info": {"calls": 1}}}}
    (run / "manifest.json").write_text(json.dumps(manifest))  # the stage recorded again
    assert kept(before, run) == [
        "calls-0.jsonl: 1 journal records lost",
        "manifest.json: stages recorded again: rollouts",
        "nodes.parquet: rewritten after the kill",
    ]
    (run / "nodes.parquet").unlink()
    assert "nodes.parquet: gone after the kill" in kept(before, run)


def test_same_shape_counts_parquet_rows_and_files(tmp_path: Path) -> None:
    reference = iteration(tmp_path / "reference")
    run = iteration(tmp_path / "run")
    (run / "calls-0.jsonl").write_text('{"key": "other", "texts": ["answers differ"]}\n')
    assert same_shape(reference, run) == []  # other answers, the same files and rows
    pq.write_table(pa.table({"x": [1, 2, 3]}), run / "nodes.parquet")
    (run / "extra.parquet").write_bytes((reference / "nodes.parquet").read_bytes())
    (reference / "calls-0.jsonl").rename(reference / "calls-1.jsonl")
    assert same_shape(reference, run) == [
        "calls-1.jsonl: missing",
        "calls-0.jsonl: not in the reference",
        "extra.parquet: not in the reference",
        "nodes.parquet: 3 rows, the reference 2",
    ]
