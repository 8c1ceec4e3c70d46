"""Running one stage resumably: the manifest check every stage goes through."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from nip_core.run.artifacts import (
    RunPaths,
    load_manifest,
    record_stage,
    save_manifest,
    stage_is_done,
)
from nip_core.run.iteration_context import IterationContext


def run_stage(
    paths: RunPaths,
    context: IterationContext,
    stage: str,
    compute: Callable[[], tuple[Mapping[str, str], Mapping[str, Any]]],
) -> dict:
    """Run `compute` unless the manifest shows the stage finished with intact files.

    `compute` writes the stage's files and returns (relative path -> sha256, info); the manifest
    entry is written afterwards, so a crash inside `compute` leaves the stage not done. The
    entry also records `seconds`, the wall time of `compute` in the run that finished it.
    Returns the stage's manifest entry.
    """
    finished = finished_stage(paths, context, stage)
    if finished is not None:
        return finished
    config_hash = context.hyper_params.config_hash()
    started = time.monotonic()
    files, info = compute()
    seconds = time.monotonic() - started
    manifest = load_manifest(paths, context.iteration, context.run_name, config_hash)
    manifest = record_stage(paths, context.iteration, manifest, stage, files, info, seconds)
    return manifest["stages"][stage]


def finished_stage(paths: RunPaths, context: IterationContext, stage: str) -> dict | None:
    """The stage's manifest entry when it finished with intact files, else None."""
    config_hash = context.hyper_params.config_hash()
    manifest = load_manifest(paths, context.iteration, context.run_name, config_hash)
    if stage_is_done(paths, context.iteration, manifest, stage):
        return manifest["stages"][stage]
    return None


def record_models_after(paths: RunPaths, context: IterationContext, models: dict[str, str]) -> None:
    """Write the models the next iteration starts from into the manifest (`models_after`)."""
    config_hash = context.hyper_params.config_hash()
    manifest = load_manifest(paths, context.iteration, context.run_name, config_hash)
    if manifest.get("models_after") != models:
        manifest["models_after"] = dict(models)
        save_manifest(paths, context.iteration, manifest)


def record_server_restarts(
    paths: RunPaths, context: IterationContext, restarts: list[dict]
) -> None:
    """Add restarts of the run's server during this iteration (cause, time, how long it was
    away) to the manifest's `server_restarts`."""
    if not restarts:
        return
    config_hash = context.hyper_params.config_hash()
    manifest = load_manifest(paths, context.iteration, context.run_name, config_hash)
    manifest["server_restarts"] = [*manifest.get("server_restarts", []), *restarts]
    save_manifest(paths, context.iteration, manifest)


def stage_seconds(manifest: dict) -> dict[str, float]:
    """Wall seconds per recorded stage (shards left out), in the order the stages ran."""
    return {
        stage: entry["seconds"]
        for stage, entry in manifest.get("stages", {}).items()
        if "seconds" in entry and "/" not in stage
    }
