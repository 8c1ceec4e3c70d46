"""Glue between the flows and `nip_core.tracking`: one wandb run per run folder.

The wandb run id lives in `<run_dir>/wandb_run_id`, so rerunning or resuming a run (or running
`flows.evaluate` on it later) appends to the same wandb run. Offline data goes to
`<run_dir>/wandb/` for a local artifacts root.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

from nip_core.artifacts import RunPaths, read_bytes, write_bytes
from nip_core.parameters import HyperParameters
from nip_core.tracking import NullTracker, Tracker, iteration_metrics, make_tracker

RUN_ID_FILE = "wandb_run_id"
_RUN_ID = re.compile(r"^[a-z0-9]{8,64}$")


def run_id_path(paths: RunPaths) -> str:
    return f"{paths.run_dir}/{RUN_ID_FILE}"


def tracking_run_id(paths: RunPaths) -> str:
    """The run folder's wandb run id, created on first use."""
    path = run_id_path(paths)
    if paths.fs.exists(path):
        run_id = read_bytes(paths.fs, path).decode().strip()
        if not _RUN_ID.match(run_id):
            raise ValueError(f"{path} holds an invalid wandb run id {run_id!r}; delete the file")
        return run_id
    run_id = uuid.uuid4().hex[:16]
    write_bytes(paths.fs, path, (run_id + "\n").encode())
    return run_id


def open_tracker(
    paths: RunPaths, hyper_params: HyperParameters, run_name: str, use_wandb: bool = True
) -> Tracker:
    """A started tracker for the run (a null one when `use_wandb` is False)."""
    if not use_wandb:
        return NullTracker()
    directory = paths.run_dir if paths.is_local else None
    tracker = make_tracker(True, tracking_run_id(paths), directory)
    tracker.start(run_name, hyper_params.to_dict(include_package_meta=True))
    return tracker


def log_iteration(tracker: Tracker, stats: Mapping[str, Any], iteration: int) -> None:
    """Log an iteration's statistics (and its evaluation, if any) with step = iteration."""
    tracker.log(iteration_metrics(stats), iteration)


def log_evaluation(tracker: Tracker, metrics: Mapping[str, Any], iteration: int) -> None:
    """Log a stand-alone evaluation (`flows.evaluate`) under "eval/" (or "eval_train/")."""
    prefix = "eval" if metrics.get("split", "test") == "test" else "eval_train"
    tracker.log({prefix: dict(metrics)}, iteration)
