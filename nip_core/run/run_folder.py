"""Opening a run folder for writing, and reading back what its iterations already finished.

paths = prepare_run(hp, root, run_name)     # checks the stored configuration, or stores it
stats = finished_iteration_stats(paths, hp, run_name, 0)   # None unless iteration 0 is done
"""

from __future__ import annotations

from nip_core.parameters import HyperParameters
from nip_core.run.artifacts import ArtifactError, RunPaths, read_json, stage_is_done, write_json


class ConfigError(ValueError):
    """A bad configuration: reported as one line, nothing written."""


def stored_config_matches(paths: RunPaths, hp: HyperParameters) -> bool:
    """Whether the run folder has no stored configuration or the same one as `hp`."""
    stored = paths.hyper_params
    if not paths.fs.exists(stored):
        return True
    return HyperParameters.from_dict(read_json(paths.fs, stored)).config_hash() == hp.config_hash()


def prepare_run(hp: HyperParameters, root: str, run_name: str) -> RunPaths:
    """Open the run folder; its stored configuration must match (resume never asks questions)."""
    paths = RunPaths.open(root, run_name)
    if not stored_config_matches(paths, hp):
        raise ConfigError(
            f"run folder {paths.run_dir} holds a different configuration; "
            "use another --run-name or the same settings"
        )
    if not paths.fs.exists(paths.hyper_params):
        write_json(paths.fs, paths.hyper_params, hp.to_dict(include_package_meta=True))
    return paths


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

    `models_after` is written last, after the switch (and its guard), so its presence marks a
    finished iteration; every recorded stage's files are checked as a rerun would. None when
    anything is missing, changed or unreadable: then the flow runs and repairs what it must.
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
