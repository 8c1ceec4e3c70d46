"""Opening a run folder for writing, and reading back what its iterations already finished.

paths = prepare_run(hp, root, run_name)     # checks the stored configuration, or stores it
stats = finished_iteration_stats(paths, hp, run_name, 0)   # None unless iteration 0 is done
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from nip_core.data.splits import load_split
from nip_core.parameters import HyperParameters
from nip_core.parameters.versions import PACKAGE_NAME_KEY, PACKAGE_VERSION_KEY
from nip_core.run.artifacts import ArtifactError, RunPaths, read_json, stage_is_done, write_json

log = logging.getLogger(__name__)
TMP_PREFIX = ".tmp-"  # atomic writes go through `.tmp-<uuid>-<name>` siblings


class ConfigError(ValueError):
    """A bad configuration: reported as one line, nothing written."""


def stored_config(paths: RunPaths) -> tuple[dict, HyperParameters] | None:
    """The configuration the run folder stored, as written and as loaded; None before its
    first run."""
    if not paths.fs.exists(paths.hyper_params):
        return None
    written = read_json(paths.fs, paths.hyper_params)
    return written, HyperParameters.from_dict(written)


def stored_config_matches(paths: RunPaths, hp: HyperParameters) -> bool:
    """Whether the run folder has no stored configuration or the same one as `hp`."""
    return _holds_same(stored_config(paths), hp)


def _holds_same(stored: tuple[dict, HyperParameters] | None, hp: HyperParameters) -> bool:
    return stored is None or stored[1].config_hash() == hp.config_hash()


def check_stored_config(
    paths: RunPaths, hp: HyperParameters
) -> tuple[dict, HyperParameters] | None:
    """The run folder's stored configuration (`stored_config`); ConfigError when it is another
    than `hp`."""
    stored = stored_config(paths)
    if not _holds_same(stored, hp):
        raise ConfigError(
            f"run folder {paths.run_dir} holds a different configuration; "
            "use another --run-name or the same settings"
        )
    return stored


def prepare_run(hp: HyperParameters, root: str, run_name: str) -> RunPaths:
    """Open the run folder; its stored configuration must match (resume never asks questions).

    The stored configuration is then rewritten as `hp` writes it: with the `rl.num_iterations`
    asked for (a run extended, or stopped earlier), and in today's format when an older version
    wrote it (its manifests' hashes are upgraded first, `upgrade_manifest_hashes`)."""
    paths = RunPaths.open(root, run_name)
    stored = check_stored_config(paths, hp)
    written = hp.to_dict(include_package_meta=True)
    if stored is not None:
        upgrade_manifest_hashes(paths, *stored, hp)
        before = stored[1].rl.num_iterations
        if before != hp.rl.num_iterations:
            log.info("%s: rl.num_iterations %d -> %d", paths.run_dir, before, hp.rl.num_iterations)
    if stored is None or stored[0] != written:
        write_json(paths.fs, paths.hyper_params, written)
    sweep_temporary_files(paths)
    return paths


def upgrade_manifest_hashes(
    paths: RunPaths, written: dict, loaded: HyperParameters, hp: HyperParameters
) -> list[int]:
    """Give the manifests today's `config_hash` where only the hash's definition moved under
    them: the run folder's stored configuration (`written` in its hyper_params.json, `loaded`
    from it; it matches `hp`) was written in an older format (settings since moved or dropped),
    or the manifest holds its legacy hash (`rl.num_iterations` counted in). The stored
    configuration, checked first, is what guards a folder against another configuration.
    Returns the iterations rewritten."""
    older_format = _without_meta(written) != _without_meta(loaded.to_dict())
    legacy, current = loaded.legacy_config_hash(), hp.config_hash()
    upgraded = []
    for iteration in paths.iterations():
        try:
            manifest = read_json(paths.fs, paths.manifest(iteration))
        except ArtifactError:
            continue  # load_manifest moves it aside when its iteration runs
        if not isinstance(manifest, dict) or manifest.get("config_hash") == current:
            continue
        if older_format or manifest.get("config_hash") == legacy:
            write_json(paths.fs, paths.manifest(iteration), manifest | {"config_hash": current})
            upgraded.append(iteration)
    return upgraded


def _without_meta(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in (PACKAGE_NAME_KEY, PACKAGE_VERSION_KEY)}


def sweep_temporary_files(paths: RunPaths) -> list[str]:
    """Delete the half-written `.tmp-*` files a killed writer left in the run folder.

    Called with the run-folder lock held, so no live writer owns them. Returns what went.
    """
    if not paths.fs.exists(paths.run_dir):
        return []
    stale = [p for p in paths.fs.find(paths.run_dir) if p.rsplit("/", 1)[-1].startswith(TMP_PREFIX)]
    for path in stale:
        log.warning("removing a temporary file left by an interrupted write: %s", path)
        paths.fs.rm_file(path)
    return stale


def preflight(hp: HyperParameters, root: str, run_name: str, splits=("train",)) -> RunPaths:
    """Everything a run command can check before it writes anything (ConfigError otherwise):
    the run name, the stored configuration, a writable artifacts root and readable data."""
    paths = RunPaths.open(root, run_name)
    check_stored_config(paths, hp)
    if paths.is_local:
        check_writable(Path(paths.run_dir))
    for split in splits:
        try:
            rows = len(load_split(hp, split))
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"dataset {hp.dataset!r} ({split} split): {e}") from e
        if rows == 0:
            raise ConfigError(f"dataset {hp.dataset!r} has no rows in its {split} split")
    return paths


def check_writable(folder: Path) -> None:
    """ConfigError unless `folder`, or its nearest existing ancestor, can be written."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write the run folder {folder}: {existing} is not writable")


def previous_group_models(paths: RunPaths, iteration: int) -> dict[str, str]:
    """Models the previous iteration switched to (empty for the first iteration)."""
    if iteration == 0 or not paths.fs.exists(paths.manifest(iteration - 1)):
        return {}
    manifest = read_json(paths.fs, paths.manifest(iteration - 1))
    return dict(manifest.get("models_after", {}))


def finished_iteration_stats(
    paths: RunPaths, hp: HyperParameters, run_name: str, iteration: int
) -> dict | None:
    """The stored statistics of an iteration whose every stage finished with intact files.

    `models_after` is written by the switch guard, the last stage that decides anything, so its
    presence marks a finished iteration; every recorded stage's files are checked as a rerun
    would. None when anything is missing, changed or unreadable: then the flow runs and repairs
    what it must.
    """
    try:
        if not paths.fs.exists(paths.manifest(iteration)) or not stored_config_matches(paths, hp):
            return None
        manifest = read_json(paths.fs, paths.manifest(iteration))
    except (ArtifactError, ValueError, KeyError, TypeError, OSError):
        return None
    if manifest.get("config_hash") != hp.config_hash() or manifest.get("run_name") != run_name:
        return None
    if "models_after" not in manifest or "stats" not in manifest:
        return None
    if not all(stage_is_done(paths, iteration, manifest, s) for s in manifest.get("stages", {})):
        return None
    stats = dict(manifest["stats"])
    evaluation = manifest["stages"].get("evaluate")
    if evaluation is not None:
        stats["eval"] = evaluation["info"]
    stats["models_after"] = manifest["models_after"]
    return stats
