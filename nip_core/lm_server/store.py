"""On-disk state of the language-model server: uploaded files, fine-tuning jobs and adapters.

Everything is plain JSON under the state dir, written atomically (temp file + rename), so the
server can be killed at any moment and restarted without losing or corrupting its records.
Layout::

    <state>/files/<file-id>/{meta.json,content}
    <state>/jobs/<job-id>/{job.json,status.json,events.jsonl,config.json,output/}
    <state>/adapters.json            # served name -> {"path", "kind", "base_model"}
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nip_core.model_api.jsonl import jsonl_lines


def new_id(prefix: str) -> str:
    """A short random id with an OpenAI-style prefix (`file-…`, `ftjob-…`, `ftevent-…`)."""
    return f"{prefix}-{secrets.token_hex(12)}"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as JSON so readers see either the old or the new file, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def replaced_directory(target: Path) -> Iterator[Path]:
    """A temporary folder beside `target` to fill; when the block ends without an error it
    replaces `target` whole, so readers never see a half-written folder (a model checkpoint)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_state_json(path: Path, default: Any = None) -> Any:
    """The JSON content of `path`, or `default` when it does not exist (yet)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default


def append_event(job_dir: Path, message: str, level: str = "info", data: Any = None) -> None:
    """Append one event line; single small O_APPEND writes do not interleave between processes."""
    event = {
        "id": new_id("ftevent"),
        "object": "fine_tuning.job.event",
        "created_at": int(time.time()),
        "level": level,
        "message": message,
        "type": "metrics" if data is not None else "message",
        "data": data,
    }
    line = json.dumps(event) + "\n"
    fd = os.open(job_dir / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def read_events(job_dir: Path) -> list[dict]:
    """All events of a job in the order they were written (a torn last line is skipped)."""
    path = job_dir / "events.jsonl"
    if not path.exists():
        return []
    events = []
    for _, line in jsonl_lines(path.read_text(encoding="utf-8")):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


class StateDir:
    """Paths and record I/O under one state dir; holds no state of its own beyond the root."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        for sub in ("files", "jobs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def file_dir(self, file_id: str) -> Path:
        return self.root / "files" / _safe_id(file_id)

    def job_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / _safe_id(job_id)

    def save_file(self, filename: str, purpose: str, content: bytes) -> dict:
        """Store an uploaded file and return its OpenAI file object."""
        file_id = new_id("file")
        directory = self.file_dir(file_id)
        directory.mkdir(parents=True)
        (directory / "content").write_bytes(content)
        meta = {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
        }
        write_json_atomic(directory / "meta.json", meta)
        return meta

    def file_meta(self, file_id: str) -> dict | None:
        return read_state_json(self.file_dir(file_id) / "meta.json")

    def save_job(self, job: dict) -> None:
        write_json_atomic(self.job_dir(job["id"]) / "job.json", job)

    def load_jobs(self) -> list[dict]:
        """Every stored job record, oldest first."""
        jobs = [
            read_state_json(d / "job.json") for d in (self.root / "jobs").iterdir() if d.is_dir()
        ]
        return sorted(
            (j for j in jobs if j),
            key=lambda j: (j["created_at"], j.get("_created_ns", 0), j["id"]),
        )

    def load_adapters(self) -> dict[str, dict]:
        return read_state_json(self.root / "adapters.json", {})

    def save_adapters(self, adapters: dict[str, dict]) -> None:
        write_json_atomic(self.root / "adapters.json", adapters)


def _safe_id(value: str) -> str:
    """Reject ids that could escape the state dir (`..`, slashes)."""
    if not value or not all(c.isalnum() or c in "-_" for c in value):
        raise KeyError(f"invalid id {value!r}")
    return value
