"""Where a result came from: the code, the packages, the machine, the command and the settings.

A figure that cannot be traced to the commit and configuration that made it cannot be checked
or repeated. Every invocation of an experiment or an iteration appends one record to the run
folder's `provenance.json` (a run resumed on another day, commit or machine gets a second
record): the git commit and whether the tree had uncommitted changes, the versions of the
packages that decide what is computed, the machine (CPU model, cores, the CPU flags that change
speed, memory, GPU), the command line, when it started and ended. An experiment adds each arm's
resolved configuration; `scripts/combine_experiments.py` carries the records into a result
folder. Reading the machine and git are the only side effects, in `collect`; the rest is pure.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from nip_core.run.artifacts import RunPaths, read_json, write_json
from nip_core.run.iteration_files import PROVENANCE_FILE

UNKNOWN = "unknown"
# The packages whose versions decide what a run computes.
PACKAGES = (
    "nip-malt",
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "prefect",
    "numpy",
    "pandas",
    "pyarrow",
    "openai",
)
# CPU flags that change how fast (and in which precision) a CPU trains and serves.
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
REQUIRED = ("commit", "dirty", "packages", "machine", "command")
REPO = Path(__file__).resolve().parents[2]


def git_state(root: Path = REPO) -> dict[str, Any]:
    """{"commit": the full hash or "unknown", "dirty": tracked changes uncommitted, or None}."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit or UNKNOWN, "dirty": None if status is None else bool(status)}


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed version of each package ("unknown" where it is not installed)."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = UNKNOWN
    vllm = REPO / ".venv-vllm"
    if vllm.is_dir():  # vLLM serves from its own environment (scripts/setup_vllm.sh)
        found = sorted(vllm.glob("lib/python*/site-packages/vllm*.dist-info"))
        name = found[-1].name.removesuffix(".dist-info") if found else ""
        versions["vllm (.venv-vllm)"] = name.split("-")[-1] if found else UNKNOWN
    return versions


def cpu_description(cpuinfo: str) -> dict[str, Any]:
    """CPU model and speed flags from the text of /proc/cpuinfo."""
    model, flags = UNKNOWN, set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == UNKNOWN:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return {"cpu": model, "cpu_flags": [f for f in SPEED_FLAGS if f in flags]}


def machine() -> dict[str, Any]:
    """This machine: CPU model, cores, speed flags, memory, GPU."""
    try:
        cpu = cpu_description(Path("/proc/cpuinfo").read_text(encoding="utf-8"))
    except OSError:
        cpu = {"cpu": platform.processor() or UNKNOWN, "cpu_flags": []}
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory: float | str = round(pages * size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        memory = UNKNOWN
    return {
        **cpu,
        "cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "memory_gib": memory,
        "gpu": gpu_name(),
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
    }


def gpu_name() -> str | None:
    """The first NVIDIA GPU's name, None without one. Asked of `nvidia-smi`, not torch: the
    flow process does not import torch (seconds and hundreds of MB)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    names = done.stdout.strip().splitlines() if done.returncode == 0 else []
    return names[0].strip() if names else None


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def collect(command: list[str] | None = None) -> dict[str, Any]:
    """A record of this invocation as it starts (`ended` is filled in by `end_invocation`)."""
    return {
        **git_state(),
        "packages": package_versions(),
        "machine": machine(),
        "command": list(sys.argv if command is None else command),
        "started": now(),
        "ended": None,
    }


def missing_fields(record: dict[str, Any]) -> list[str]:
    """The required fields a provenance record lacks (a field may say "unknown")."""
    return [name for name in REQUIRED if name not in record]


def read_records(paths: RunPaths) -> list[dict[str, Any]]:
    path = f"{paths.run_dir}/{PROVENANCE_FILE}"
    if not paths.fs.exists(path):
        return []
    data = read_json(paths.fs, path)
    return list(data.get("invocations", [])) if isinstance(data, dict) else []


def write_records(paths: RunPaths, records: list[dict[str, Any]], **extra: Any) -> None:
    """The run folder's provenance file, written whole (atomically)."""
    path = f"{paths.run_dir}/{PROVENANCE_FILE}"
    previous = read_json(paths.fs, path) if paths.fs.exists(path) else {}
    kept = (
        {k: v for k, v in previous.items() if k != "invocations"}
        if isinstance(previous, dict)
        else {}
    )
    write_json(paths.fs, path, kept | extra | {"invocations": records})


def start_invocation(paths: RunPaths, record: dict[str, Any], **extra: Any) -> int:
    """Append `record` to the run folder's invocations; its index, for `end_invocation`. `extra`
    (e.g. each arm's resolved configuration) is kept at the file's top level."""
    records = read_records(paths) + [record]
    write_records(paths, records, **extra)
    return len(records) - 1


def end_invocation(paths: RunPaths, index: int, **fields: Any) -> None:
    """Mark invocation `index` ended (with `fields`, e.g. its outcome)."""
    records = read_records(paths)
    if 0 <= index < len(records):
        records[index] |= {"ended": now(), **fields}
        write_records(paths, records)


# The fields every result folder's provenance.json holds (older folders: "unknown" where they
# could not be recovered).
RESULT_FIELDS = ("commit", "dirty", "command", "configuration", "machine", "packages", "wall_time")


def result_provenance(experiments: dict[str, dict[str, Any]], command: list[str]) -> dict:
    """A result folder's provenance from the provenance files of the experiment folders it
    combines (folder name -> file contents): every invocation kept under `sources`; the
    commits, machines and commands they ran with; each arm's configuration (the first
    experiment's where several ran an arm); the summed wall time of the invocations."""
    experiments = by_experiment(experiments)
    runs = [
        dict(r, experiment=name)
        for name, data in experiments.items()
        for r in data.get("invocations", [])
    ]
    configuration: dict[str, Any] = {}
    for data in experiments.values():
        for arm, config in (data.get("arms") or {}).items():
            configuration.setdefault(arm, config)

    def distinct(key: str) -> Any:
        values = []
        for run in runs:
            value = run.get(key, UNKNOWN)
            if value not in values:
                values.append(value)
        if not values:
            return UNKNOWN
        return values[0] if len(values) == 1 else values

    return {
        "commit": distinct("commit"),
        "dirty": distinct("dirty"),
        "command": {name: distinct_commands(data) for name, data in experiments.items()},
        "configuration": configuration or UNKNOWN,
        "machine": distinct("machine"),
        "packages": distinct("packages"),
        "wall_time": wall_seconds(runs),
        "combined_by": command,
        "sources": runs,
    }


def by_experiment(folders: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Experiment name -> its invocations and arms, from each folder's provenance file: an
    experiment folder's own, or, for a result folder combined before (its `sources`), each
    experiment it drew on. A run folder published before and extended since is one experiment
    (its invocations in order, the first record's arm configurations kept)."""
    merged: dict[str, dict[str, Any]] = {}
    for folder, data in folders.items():
        if "sources" in data:
            arms = data.get("configuration")
            parts = [
                (
                    source.get("experiment", folder),
                    [{k: v for k, v in source.items() if k != "experiment"}],
                    arms if isinstance(arms, dict) else {},
                )
                for source in data["sources"]
            ]
        else:
            parts = [(folder, data.get("invocations", []), data.get("arms") or {})]
        for name, invocations, arms in parts:
            record = merged.setdefault(name, {"invocations": [], "arms": {}})
            record["invocations"] += invocations
            record["arms"] = arms | record["arms"]
    return merged


def distinct_commands(data: dict[str, Any]) -> list[list[str]] | str:
    commands: list[list[str]] = []
    for run in data.get("invocations", []):
        if run.get("command") not in commands:
            commands.append(run.get("command"))
    return commands or UNKNOWN


def wall_seconds(runs: list[dict[str, Any]]) -> float | str:
    """Seconds between start and end, summed over the invocations that ended."""
    total, counted = 0.0, False
    for run in runs:
        if run.get("started") and run.get("ended"):
            start, end = (datetime.fromisoformat(run[k]) for k in ("started", "ended"))
            total += (end - start).total_seconds()
            counted = True
    return round(total, 1) if counted else UNKNOWN
