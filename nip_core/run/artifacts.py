"""All artifact I/O: paths, atomic writes, Parquet/JSON, per-iteration manifests.

Stages never touch files directly; they call this module, which works on any fsspec filesystem,
so the artifacts root can be a local folder today and an object-store URL later.

Layout (fixed; tests and users rely on it)::

    <root>/<run>/hyper_params.json
    <root>/<run>/iterations/<NNNN>/{batch,nodes,rewards,pairs}.parquet
    <root>/<run>/iterations/<NNNN>/datasets/{dpo,sft}/<group>.parquet (+ .jsonl)
    <root>/<run>/iterations/<NNNN>/manifest.json

Every file is written to a temporary name and renamed into place, and a stage's manifest entry
is written after its files, so a manifest entry exists only for a finished stage.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

import nip_core
from nip_core.run.iteration_files import (
    HYPER_PARAMS_FILE,
    ITERATIONS_DIR,
    MANIFEST_FILE,
    iteration_folder,
)

log = logging.getLogger(__name__)

MANIFEST_SCHEMA_VERSION = 1
DEFAULT_ROOT_ENV = "NIP_ARTIFACTS_ROOT"


class ArtifactError(RuntimeError):
    """A missing, corrupt or inconsistent artifact."""


def default_root() -> str:
    return os.environ.get(DEFAULT_ROOT_ENV, "artifacts")


@dataclass(frozen=True)
class RunPaths:
    """Where one run's files live on one filesystem.

    `replay_runs`: folders of other runs (same filesystem) whose first iteration's rollout call
    journals this run's first iteration replays, read and never written: an experiment's arms
    that start from the same models with the same agents (a control beside `malt`) draw their
    first rollouts once (`nip_core.play.rollout_stage.sibling_journals`). Later iterations
    sample models of each run's own and replay nothing of another run.
    """

    fs: fsspec.AbstractFileSystem
    run_dir: str
    replay_runs: tuple[str, ...] = ()

    @classmethod
    def open(cls, root: str, run_name: str) -> RunPaths:
        if not run_name or "/" in run_name or run_name.startswith("."):
            raise ValueError(f"invalid run name {run_name!r}: use a plain folder name")
        fs, base = fsspec.core.url_to_fs(root)
        if isinstance(fs, LocalFileSystem):
            base = os.path.abspath(base)
        return cls(fs=fs, run_dir=f"{base.rstrip('/')}/{run_name}")

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    @property
    def hyper_params(self) -> str:
        return f"{self.run_dir}/{HYPER_PARAMS_FILE}"

    def iteration_dir(self, iteration: int) -> str:
        return f"{self.run_dir}/{iteration_folder(iteration)}"

    def iteration_file(self, iteration: int, relative: str) -> str:
        return f"{self.iteration_dir(iteration)}/{relative}"

    def manifest(self, iteration: int) -> str:
        return self.iteration_file(iteration, MANIFEST_FILE)

    def iterations(self) -> list[int]:
        pattern = f"{self.run_dir}/{ITERATIONS_DIR}/*/{MANIFEST_FILE}"
        found = [p.rstrip("/").split("/")[-2] for p in self.fs.glob(pattern)]
        return sorted(int(name) for name in found if name.isdigit())


# --------------------------------------------------------------------------------------------
# Atomic writes and checked reads


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_bytes(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> str:
    """Write `data` so that `path` holds either its old content or all of `data`; returns the
    sha256. Locally: a temporary sibling, fsync'd and renamed into place. On an object store
    (no atomic rename there): one PUT, which makes the object appear whole or not at all."""
    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, data)
        return sha256_bytes(data)
    parent = path.rsplit("/", 1)[0]
    fs.makedirs(parent, exist_ok=True)
    tmp = f"{parent}/.tmp-{uuid.uuid4().hex}-{path.rsplit('/', 1)[-1]}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return sha256_bytes(data)


def read_bytes(fs: fsspec.AbstractFileSystem, path: str) -> bytes:
    try:
        return fs.cat_file(path)
    except FileNotFoundError as e:
        raise ArtifactError(f"missing artifact: {path}") from e


def parquet_bytes(table: pa.Table, metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialise deterministically: same table, same bytes (no timestamps, fixed options)."""
    if metadata:
        merged = dict(table.schema.metadata or {})
        merged.update({k.encode(): v.encode() for k, v in metadata.items()})
        table = table.replace_schema_metadata(merged)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", write_statistics=True)
    return sink.getvalue()


def write_parquet(
    fs: fsspec.AbstractFileSystem,
    path: str,
    table: pa.Table,
    metadata: Mapping[str, str] | None = None,
) -> str:
    return write_bytes(fs, path, parquet_bytes(table, metadata))


def read_parquet(fs: fsspec.AbstractFileSystem, path: str) -> pa.Table:
    data = read_bytes(fs, path)
    try:
        return pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as e:
        raise ArtifactError(f"corrupt Parquet artifact {path}: {e}") from e


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def write_json(fs: fsspec.AbstractFileSystem, path: str, obj: Any) -> str:
    return write_bytes(fs, path, json_bytes(obj))


def read_json(fs: fsspec.AbstractFileSystem, path: str) -> Any:
    data = read_bytes(fs, path)
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise ArtifactError(f"corrupt JSON artifact {path}: {e}") from e


def jsonl_bytes(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


# --------------------------------------------------------------------------------------------
# Manifests: the checkpoint of an iteration


def new_manifest(run_name: str, iteration: int, config_hash: str) -> dict:
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "package_version": nip_core.__version__,
        "run_name": run_name,
        "iteration": iteration,
        "config_hash": config_hash,
        "stages": {},
        "stats": {},
    }


def load_manifest(paths: RunPaths, iteration: int, run_name: str, config_hash: str) -> dict:
    """The iteration's manifest, or a fresh one; a manifest from another config is an error."""
    path = paths.manifest(iteration)
    if not paths.fs.exists(path):
        return new_manifest(run_name, iteration, config_hash)
    manifest = _readable_manifest(paths, path)
    if manifest is None:
        return new_manifest(run_name, iteration, config_hash)
    if manifest.get("schema_version") != MANIFEST_SCHEMA_VERSION:
        raise ArtifactError(f"{path}: unsupported manifest schema {manifest.get('schema_version')}")
    if manifest.get("config_hash") != config_hash:
        raise ArtifactError(
            f"{path} was written with a different configuration (config hash "
            f"{manifest.get('config_hash')} != {config_hash}); use a new --run-name"
        )
    return manifest


def manifest_stages(paths: RunPaths, iteration: int) -> dict:
    """The stages an iteration's manifest records ({} where the iteration has none): for
    readers of a run, which never rewrite it."""
    path = paths.manifest(iteration)
    return dict(read_json(paths.fs, path).get("stages") or {}) if paths.fs.exists(path) else {}


def _readable_manifest(paths: RunPaths, path: str) -> dict | None:
    """The manifest at `path`, or None after moving an unreadable one aside with a warning.

    Every stage re-checks its files, finished model calls are replayed from the journal and
    fine-tune job ids live in their own files, so starting the manifest afresh loses no work.
    """
    try:
        manifest = read_json(paths.fs, path)
    except ArtifactError as e:
        problem = str(e)
    else:
        if isinstance(manifest, dict) and isinstance(manifest.get("stages"), dict):
            return manifest
        problem = f"{path} is not a manifest object"
    aside = f"{path}.corrupt-{uuid.uuid4().hex[:8]}"
    paths.fs.mv(path, aside)
    log.warning("%s; moved it to %s and starting the iteration's manifest afresh", problem, aside)
    return None


def save_manifest(paths: RunPaths, iteration: int, manifest: dict) -> None:
    write_json(paths.fs, paths.manifest(iteration), manifest)


def record_stage(
    paths: RunPaths,
    iteration: int,
    manifest: dict,
    stage: str,
    files: Mapping[str, str],
    info: Mapping[str, Any] | None = None,
    seconds: float | None = None,
) -> dict:
    """Mark `stage` done with its files (relative path -> sha256); written after the files.
    `seconds`: the wall time of the computation that finished it."""
    updated = json.loads(json.dumps(manifest))
    entry: dict[str, Any] = {"files": dict(sorted(files.items())), "info": dict(info or {})}
    if seconds is not None:
        entry["seconds"] = round(seconds, 3)
    updated["stages"][stage] = entry
    save_manifest(paths, iteration, updated)
    return updated


def stage_is_done(paths: RunPaths, iteration: int, manifest: dict, stage: str) -> bool:
    """True if the stage is recorded and every file it wrote is present with its checksum."""
    entry = manifest["stages"].get(stage)
    if entry is None:
        return False
    for relative, digest in entry["files"].items():
        path = paths.iteration_file(iteration, relative)
        if not paths.fs.exists(path):
            log.warning("stage %r: %s is missing; recomputing the stage", stage, path)
            return False
        if sha256_bytes(paths.fs.cat_file(path)) != digest:
            log.warning("stage %r: checksum mismatch for %s; recomputing the stage", stage, path)
            return False
    return True


def forget_stages(manifest: dict, stages: list[str]) -> dict:
    updated = json.loads(json.dumps(manifest))
    for stage in stages:
        updated["stages"].pop(stage, None)
    return updated


# --------------------------------------------------------------------------------------------
# Reading a run back
