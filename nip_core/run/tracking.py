"""Experiment tracking with Weights & Biases: offline by default, never a secret, never fatal.

`make_tracker` returns a `WandbTracker` or, when tracking is disabled or wandb cannot be
imported, a `NullTracker` with the same three methods (`start`, `log`, `finish`). A tracking
failure is logged and tracking stops; it never stops training.

Mode: `WANDB_MODE` when set, else offline (`wandb sync` uploads it later): an API key or a login
alone never makes a run wait on the network.
Metrics are plotted against an "iteration" axis (wandb `define_metric`), so an evaluation logged
after the fact for an earlier iteration is kept rather than dropped as an out-of-order step.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from nip_core.parameters import HyperParameters
from nip_core.run.artifacts import RunPaths, read_bytes, write_bytes
from nip_core.run.iteration_files import RUN_ID_FILE

log = logging.getLogger(__name__)

DEFAULT_PROJECT = "nip-malt"
SECRET_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET")
REDACTED = "<redacted>"
STEP_KEY = "iteration"


class Tracker(Protocol):
    def start(self, run_name: str, config: Mapping[str, Any]) -> None: ...
    def log(self, metrics: Mapping[str, Any], step: int) -> None: ...
    def finish(self) -> None: ...


class NullTracker:
    """Tracking switched off: every call does nothing."""

    enabled = False

    def start(self, run_name: str, config: Mapping[str, Any]) -> None:
        pass

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        pass

    def finish(self) -> None:
        pass


# --------------------------------------------------------------------------------------------
# Secrets and metric shaping (pure)


def secret_values(env: Mapping[str, str] | None = None) -> list[str]:
    """Values of environment variables whose names look like credentials (longest first)."""
    env = os.environ if env is None else env
    found = {v for k, v in env.items() if k.upper().endswith(SECRET_SUFFIXES) and v.strip()}
    return sorted(found, key=len, reverse=True)


def scrub(obj: Any, secrets: list[str]) -> Any:
    """A copy of `obj` with every secret value (whole or inside a string) replaced."""
    if isinstance(obj, Mapping):
        return {scrub(k, secrets): scrub(v, secrets) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [scrub(v, secrets) for v in obj]
    if isinstance(obj, str):
        for secret in secrets:
            obj = obj.replace(secret, REDACTED)
    return obj


def flatten_metrics(stats: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of nested `stats` as {"a/b/c": value}; None, strings and lists are dropped."""
    flat: dict[str, float] = {}
    for key, value in stats.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_metrics(value, name))
        elif isinstance(value, bool):
            flat[name] = float(value)
        elif isinstance(value, int | float):
            flat[name] = value
    return flat


def iteration_metrics(stats: Mapping[str, Any]) -> dict[str, float]:
    """What is logged per iteration: training summary under "train/", evaluation under "eval/"."""
    train = {k: v for k, v in stats.items() if k not in ("eval", "models_after")}
    flat = flatten_metrics(train, "train")
    if stats.get("eval"):
        flat.update(flatten_metrics(stats["eval"], "eval"))
    return flat


# --------------------------------------------------------------------------------------------
# Mode selection


def default_mode(env: Mapping[str, str] | None = None) -> str:
    """The user's WANDB_MODE, else "offline": a run never waits on the network unless online
    logging was asked for explicitly (`WANDB_MODE=online`), even with an API key or a login
    (with no network, wandb's online start stalled a run for 90 s).

    Always passed to `wandb.init` explicitly: wandb keeps the settings of its first `init` in a
    process, so a later change of WANDB_MODE would otherwise be ignored.
    """
    env = os.environ if env is None else env
    return env.get("WANDB_MODE") or "offline"


# --------------------------------------------------------------------------------------------
# The tracker


class WandbTracker:
    """One wandb run per run folder: `run_id` is reused (resume="allow"), so reruns append."""

    enabled = True

    def __init__(
        self, wandb_module: Any, run_id: str, directory: str | None, project: str | None = None
    ) -> None:
        self._wandb = wandb_module
        self.run_id = run_id
        self.directory = directory
        self.project = project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        self.run: Any = None

    def start(self, run_name: str, config: Mapping[str, Any]) -> None:
        if self.run is not None:
            return
        if self.directory is not None:
            Path(self.directory).mkdir(parents=True, exist_ok=True)
        # We do not trace LLM calls with Weave; skip wandb's "install Weave" hint (user wins).
        os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")
        try:
            self.run = self._wandb.init(
                project=self.project,
                id=self.run_id,
                name=run_name,
                resume="allow",
                dir=self.directory,
                mode=default_mode(),
                config=scrub(dict(config), secret_values()),
                settings=self._wandb.Settings(console="off", save_code=False, quiet=True),
            )
            self.run.define_metric(STEP_KEY)
            self.run.define_metric("*", step_metric=STEP_KEY)
        except Exception as e:  # noqa: BLE001 - tracking must never stop training
            self._give_up("start", e)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self.run is None:
            return
        numeric = flatten_metrics(metrics)
        try:
            self.run.log({**numeric, STEP_KEY: int(step)})
        except Exception as e:  # noqa: BLE001
            self._give_up("log", e)

    def finish(self) -> None:
        if self.run is None:
            return
        run, self.run = self.run, None
        try:
            run.finish()
        except Exception as e:  # noqa: BLE001
            log.warning("wandb finish failed (%s); tracking data may be incomplete", _describe(e))

    def _give_up(self, what: str, error: Exception) -> None:
        log.warning("wandb %s failed (%s); continuing without tracking", what, _describe(error))
        run, self.run = self.run, None
        if run is not None:
            try:
                run.finish(exit_code=1)
            except Exception:  # noqa: BLE001
                pass


def _describe(error: Exception) -> str:
    return scrub(f"{type(error).__name__}: {error}", secret_values())


def make_tracker(
    enabled: bool, run_id: str, directory: str | None, project: str | None = None
) -> WandbTracker | NullTracker:
    """A wandb tracker, or a null one when disabled or when wandb cannot be imported."""
    if not enabled:
        return NullTracker()
    try:
        import wandb
    except Exception as e:  # noqa: BLE001 - any import failure means "no tracking"
        log.warning("wandb unavailable (%s); tracking disabled", _describe(e))
        return NullTracker()
    return WandbTracker(wandb, run_id, directory, project)


# --------------------------------------------------------------------------------------------
# Reading an offline run back (tests, and checking a run before `wandb sync`)

_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(data: bytes) -> Iterator[bytes]:
    """Payloads of a `.wandb` transaction log (LevelDB-style blocks after a 7-byte header)."""
    if data[:4] != b":W&B":
        raise ValueError("not a wandb transaction log (bad magic)")
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
            pending = b""


def offline_logs(run_dir: str | Path, run_id: str) -> list[Path]:
    """Every offline `.wandb` log of wandb run `run_id` under `<run_dir>/wandb`, oldest first."""
    found = Path(run_dir, "wandb").glob(f"offline-run-*/run-{run_id}.wandb")
    return sorted(found, key=lambda p: p.stat().st_mtime)


def _parsed_records(wandb_file: str | Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    for payload in _records(Path(wandb_file).read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        yield record


def read_offline_history(wandb_file: str | Path) -> list[dict[str, Any]]:
    """The history rows (`run.log` calls) stored in an offline run's `run-<id>.wandb` file."""
    rows = []
    for record in _parsed_records(wandb_file):
        if record.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in record.history.item:
            key = "/".join(item.nested_key) if item.nested_key else item.key
            row[key] = json.loads(item.value_json)
        rows.append(row)
    return rows


def read_offline_config(wandb_file: str | Path) -> dict[str, Any]:
    """The run configuration (hyper-parameters) stored in an offline run's `.wandb` file."""
    config: dict[str, Any] = {}
    for record in _parsed_records(wandb_file):
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else ()
        if kind == "config":
            updates = record.config.update
        for item in updates:
            key = "/".join(item.nested_key) if item.nested_key else item.key
            config[key] = json.loads(item.value_json)
    return config


# --- one wandb run per run folder ---------------------------------------------------------------
# The wandb run id lives in `<run_dir>/wandb_run_id`, so rerunning or resuming a run (or running
# `flows.evaluate` on it later) appends to the same wandb run. Offline data goes to
# `<run_dir>/wandb/` for a local artifacts root, or to `WANDB_DIR` when that is set.

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
    # WANDB_DIR, when set, wins (wandb reads it itself); else a local run folder keeps its own.
    directory = None if os.environ.get("WANDB_DIR") or not paths.is_local else paths.run_dir
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
