"""Artifact I/O: atomic writes, deterministic Parquet, manifests and checksum-based resume."""

import logging

import pyarrow as pa
import pytest

from nip_core.run.artifacts import (
    ArtifactError,
    RunPaths,
    load_manifest,
    parquet_bytes,
    read_json,
    read_parquet,
    record_stage,
    stage_is_done,
    write_bytes,
    write_parquet,
)


def test_parquet_bytes_are_deterministic():
    table = pa.table({"a": [1, 2, 3], "b": ["x", None, "z"]})
    assert parquet_bytes(table) == parquet_bytes(pa.table({"a": [1, 2, 3], "b": ["x", None, "z"]}))


def test_write_leaves_no_temporary_files(tmp_path):
    paths = RunPaths.open(str(tmp_path), "run")
    target = paths.iteration_file(0, "nodes.parquet")
    write_parquet(paths.fs, target, pa.table({"a": [1]}))
    write_bytes(paths.fs, target, parquet_bytes(pa.table({"a": [2]})))
    files = sorted(p.name for p in (tmp_path / "run" / "iterations" / "0000").iterdir())
    assert files == ["nodes.parquet"]
    assert read_parquet(paths.fs, target).column("a").to_pylist() == [2]


def test_corrupt_and_missing_artifacts_name_the_file(tmp_path):
    paths = RunPaths.open(str(tmp_path), "run")
    target = paths.iteration_file(0, "nodes.parquet")
    with pytest.raises(ArtifactError, match="missing artifact.*nodes.parquet"):
        read_parquet(paths.fs, target)
    write_bytes(paths.fs, target, b"not parquet at all")
    with pytest.raises(ArtifactError, match="corrupt Parquet artifact.*nodes.parquet"):
        read_parquet(paths.fs, target)


def test_invalid_run_name_is_rejected(tmp_path):
    for name in ["", "a/b", ".hidden"]:
        with pytest.raises(ValueError, match="invalid run name"):
            RunPaths.open(str(tmp_path), name)


def test_stage_done_requires_matching_checksums(tmp_path, caplog):
    paths = RunPaths.open(str(tmp_path), "run")
    manifest = load_manifest(paths, 0, "run", "hash1")
    assert not stage_is_done(paths, 0, manifest, "rewards")
    digest = write_parquet(paths.fs, paths.iteration_file(0, "r.parquet"), pa.table({"a": [1]}))
    manifest = record_stage(paths, 0, manifest, "rewards", {"r.parquet": digest}, {"rows": 1})
    assert read_json(paths.fs, paths.manifest(0))["stages"]["rewards"]["info"] == {"rows": 1}
    assert stage_is_done(paths, 0, manifest, "rewards")
    write_parquet(paths.fs, paths.iteration_file(0, "r.parquet"), pa.table({"a": [2]}))
    with caplog.at_level(logging.WARNING):
        assert not stage_is_done(paths, 0, manifest, "rewards")
    assert "checksum mismatch" in caplog.text and "r.parquet" in caplog.text


def test_manifest_from_another_configuration_is_refused(tmp_path):
    paths = RunPaths.open(str(tmp_path), "run")
    manifest = load_manifest(paths, 0, "run", "hash1")
    record_stage(paths, 0, manifest, "batch", {}, {})
    with pytest.raises(ArtifactError, match="different configuration"):
        load_manifest(paths, 0, "run", "hash2")


def test_memory_filesystem_root_works():
    paths = RunPaths.open("memory://roots/test", "run")
    write_parquet(paths.fs, paths.iteration_file(1, "x.parquet"), pa.table({"a": [7]}))
    assert read_parquet(paths.fs, paths.iteration_file(1, "x.parquet")).num_rows == 1
    assert not paths.is_local
