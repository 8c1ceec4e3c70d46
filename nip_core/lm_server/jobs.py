"""Fine-tuning job lifecycle: queue, run one training child at a time, poll, cancel, recover.

Statuses follow OpenAI: queued -> validating_files (child started, checking the data) -> running
-> succeeded | failed | cancelled. The child writes `status.json` and events; this manager polls
them, loads a finished adapter into the engine under the job's new model name, and hands the
accelerator to training and back. After a restart, a job whose child still runs is re-attached;
a job whose child died with the server, or was killed by a signal (the OOM killer), trains again
from the start under the same id, a bounded number of times, then fails.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from nip_core.lm_server import procs
from nip_core.lm_server.engines.base import AdapterError, InferenceEngine
from nip_core.lm_server.job_records import new_job_record
from nip_core.lm_server.names import check_adapter_request, suffix_ok
from nip_core.lm_server.options import OptionsError, parse_options
from nip_core.lm_server.store import StateDir, append_event, read_state_json

TERMINAL = ("succeeded", "failed", "cancelled")
ACTIVE = ("validating_files", "running")


class JobError(ValueError):
    """A request about jobs that cannot be honoured; `status` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


def public_job(job: dict) -> dict:
    """The OpenAI job object: internal fields (prefixed with `_`) stay on the server."""
    return {k: v for k, v in job.items() if not k.startswith("_")}


def _order(job: dict) -> tuple:
    """Creation order; `created_at` has one-second resolution, so a nanosecond stamp breaks ties."""
    return (job["created_at"], job.get("_created_ns", 0), job["id"])


class JobManager:
    """Owns the jobs and adapters of one server; all mutations happen under one asyncio lock."""

    def __init__(self, engine: InferenceEngine, state: StateDir, base_name: str, **opts: Any):
        self.engine, self.state, self.base_name = engine, state, base_name
        self.fake = bool(opts.get("fake", engine.name == "dummy"))
        self.fake_seconds = float(opts.get("fake_seconds", 0.0))
        self.poll_interval = float(opts.get("poll_interval", 0.3))
        self.train_processes = int(opts.get("train_processes", 1))
        self.deepspeed_config = opts.get("deepspeed_config")
        self.allow_any_adapter_path = bool(opts.get("allow_any_adapter_path", False))
        self.max_training_restarts = int(opts.get("max_training_restarts", 2))
        self.jobs: dict[str, dict] = {}
        self.adapters: dict[str, dict] = {}
        self._children: dict[str, subprocess.Popen] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None

    # ---- start / stop ------------------------------------------------------------------------

    async def start(self) -> None:
        """Reload state, re-attach or fail orphaned jobs, re-load adapters, start polling."""
        self.jobs = {job["id"]: job for job in self.state.load_jobs()}
        self.adapters = self.state.load_adapters()
        for job in [j for j in self.jobs.values() if j["status"] in ACTIVE]:
            finished = read_state_json(self._dir(job) / "status.json", {}).get("status") in TERMINAL
            if not finished and not self._child_alive(job):
                self._settle_dead_child(job, died_with_server=True)
        if any(j["status"] in ACTIVE for j in self.jobs.values()):
            await self.engine.release_accelerator()  # a re-attached child is still training
        failed = []
        for name, info in list(self.adapters.items()):
            try:
                await self.engine.load_adapter(name, info["path"])
            except (AdapterError, OSError) as exc:
                failed.append(f"{name}: {exc}")
        self._task = asyncio.create_task(self._poll_forever())
        if failed:
            print("lm_server: could not re-load adapters:", "; ".join(failed))  # noqa: T201

    async def stop(self) -> None:
        """Stop polling; running children are left alone so a restarted server re-attaches."""
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # ---- requests ----------------------------------------------------------------------------

    def served_base(self, model: str) -> tuple[str, dict | None]:
        """(path of the model to train from, parent adapter info or None) for a job's `model`."""
        if model == self.base_name:
            return self.engine.models()[0], None
        info = self.adapters.get(model)
        if info is None:
            known = ", ".join([self.base_name, *self.adapters])
            raise JobError(f"model {model!r} is not served here; available: {known}", 404, "model")
        if info.get("kind") == "full":
            return info["path"], None
        return info["base_model"], {"name": model, **info}

    async def create(self, body: dict) -> dict:
        """Validate a create request and queue the job."""
        model, file_id = body.get("model"), body.get("training_file")
        if not isinstance(model, str) or not isinstance(file_id, str):
            raise JobError("'model' and 'training_file' are required strings", 400, "model")
        base_path, parent = self.served_base(model)
        try:
            known = self.state.file_meta(file_id) is not None
        except KeyError:  # a malformed id names no file
            known = False
        if not known:
            raise JobError(f"training file {file_id!r} not found", 404, "training_file")
        if not suffix_ok(body.get("suffix")):
            raise JobError(
                f"suffix must be at most 64 letters, digits, '.', '_' or '-', "
                f"got {body.get('suffix')!r}",
                400,
                "suffix",
            )
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise JobError("metadata must be an object of string values", 400, "metadata")
        try:
            options = parse_options(body.get("method"), body.get("nip_training"), body.get("seed"))
        except OptionsError as exc:
            raise JobError(str(exc), 400, exc.param) from None
        async with self._lock:
            job = self._new_job(body, options.to_dict(), metadata)
            self._write_child_config(job, base_path, parent, options.to_dict())
            self._save(job)
            append_event(self._dir(job), f"Created fine-tuning job {job['id']}")
        return public_job(job)

    def list(self, limit: int = 20, after: str | None = None, metadata: dict | None = None):
        """Jobs newest first, filtered by exact metadata matches, paged by `after`."""
        jobs = sorted(self.jobs.values(), key=_order, reverse=True)
        jobs = [
            j for j in jobs if all(j["metadata"].get(k) == v for k, v in (metadata or {}).items())
        ]
        if after is not None:
            ids = [j["id"] for j in jobs]
            jobs = jobs[ids.index(after) + 1 :] if after in ids else []
        page = jobs[:limit]
        return [public_job(j) for j in page], len(jobs) > len(page)

    def get(self, job_id: str) -> dict:
        job = self.jobs.get(job_id)
        if job is None:
            raise JobError(f"fine-tuning job {job_id!r} not found", 404, "fine_tuning_job_id")
        return job

    async def cancel(self, job_id: str) -> dict:
        """Cancel a queued or running job (its whole process group is ended)."""
        async with self._lock:
            job = self.get(job_id)
            if job["status"] in TERMINAL:
                raise JobError(f"job {job_id} is already {job['status']}", 400)
            was_active = job["status"] in ACTIVE
            if was_active:
                pid, start = job["_pid"], job.get("_pid_start")
                await asyncio.to_thread(procs.kill_group, pid, start)
                await self._reap(job_id)
            self._finish(job, "cancelled", message="Fine-tuning job cancelled")
            if was_active:
                await self.engine.reacquire_accelerator()
        return public_job(job)

    def events(self, job_id: str, limit: int = 20, after: str | None = None):
        """Events newest first, as OpenAI lists them."""
        from nip_core.lm_server.store import read_events

        events = list(reversed(read_events(self._dir(self.get(job_id)))))
        if after is not None:
            ids = [e["id"] for e in events]
            events = events[ids.index(after) + 1 :] if after in ids else []
        return events[:limit], len(events) > limit

    # ---- internals ---------------------------------------------------------------------------

    def _dir(self, job: dict) -> Path:
        return self.state.job_dir(job["id"])

    def _save(self, job: dict) -> None:
        self.jobs[job["id"]] = job
        self.state.save_job(job)

    def _new_job(self, body: dict, options: dict, metadata: dict) -> dict:
        root = self.base_name
        if body["model"] in self.adapters:
            root = self.adapters[body["model"]].get("root_name", root)
        return new_job_record(body, options, metadata, root)

    def _write_child_config(self, job: dict, base_path: str, parent: dict | None, options: dict):
        from nip_core.lm_server.store import write_json_atomic

        directory = self._dir(job)
        write_json_atomic(
            directory / "config.json",
            {
                "base_model": base_path,
                "parent_adapter": parent,
                "options": options,
                "training_file": str(self.state.file_dir(job["training_file"]) / "content"),
                "output_dir": str(directory / "output"),
                "fake": self.fake,
                "fake_seconds": self.fake_seconds,
            },
        )

    async def _poll_forever(self) -> None:
        while True:
            try:
                async with self._lock:
                    await self._poll_once()
            except Exception as exc:  # keep polling: one bad job must not stop the others
                print(f"lm_server: job poll failed: {exc!r}")  # noqa: T201
            await asyncio.sleep(self.poll_interval)

    async def _poll_once(self) -> None:
        active = [j for j in self.jobs.values() if j["status"] in ACTIVE]
        for job in active:
            await self._check_active(job)
        if not any(j["status"] in ACTIVE for j in self.jobs.values()):
            queued = sorted(
                (j for j in self.jobs.values() if j["status"] == "queued"),
                key=_order,
            )
            if queued:
                await self._launch(queued[0])

    async def _launch(self, job: dict) -> None:
        await self.engine.release_accelerator()
        child = procs.spawn_training(self._dir(job), self.train_processes, self.deepspeed_config)
        self._children[job["id"]] = child
        job.update(status="validating_files", _pid=child.pid)
        job["_pid_start"] = procs.process_start_time(child.pid)
        self._save(job)
        append_event(self._dir(job), "Training process started; validating the training file")

    async def _check_active(self, job: dict) -> None:
        status = read_state_json(self._dir(job) / "status.json", {})
        state = status.get("status")
        if state == "running" and job["status"] != "running":
            job["status"] = "running"
            self._save(job)
        if state in ("succeeded", "failed") or not self._child_alive(job):
            child = self._children.get(job["id"])
            await self._reap(job["id"])
            await self.engine.reacquire_accelerator()
            if state == "succeeded":
                await self._publish(job, status)
            else:
                killed = child is not None and (child.returncode or 0) < 0
                self._settle_dead_child(job, died_with_server=False, killed=killed)

    async def _publish(self, job: dict, status: dict) -> None:
        """Serve the finished adapter under the job's new name, then mark the job succeeded."""
        name, output = job["_new_model_name"], str(self._dir(job) / "output")
        try:
            await self.engine.load_adapter(name, output)
        except (AdapterError, OSError) as exc:
            self._finish(job, "failed", error=("adapter_load_failed", str(exc)))
            return
        base_path = read_state_json(self._dir(job) / "config.json")["base_model"]
        self.adapters[name] = {
            "path": output,
            "kind": status.get("kind", "lora"),
            "base_model": base_path,
            "root_name": job["_root_name"],
        }
        self.state.save_adapters(self.adapters)
        job.update(fine_tuned_model=name, trained_tokens=status.get("trained_tokens"))
        self._finish(job, "succeeded", message=f"New model created: {name}")

    def _settle_dead_child(self, job: dict, died_with_server: bool, killed: bool = False) -> None:
        """Record the outcome of a child that is gone: its own verdict; training again when a
        signal or the server's end took it (up to `max_training_restarts` times); else a crash."""
        status = read_state_json(self._dir(job) / "status.json", {})
        pid = job.get("_pid")
        if status.get("status") == "failed":
            error = status.get("error") or {}
            code, message = error.get("code", "training_failed"), error.get("message", "")
            self._finish(job, "failed", error=(code, message, error.get("param")))
        elif (died_with_server or killed) and self._restarts(job) < self.max_training_restarts:
            how = "died with the server" if died_with_server else "was killed by a signal"
            self._requeue(job, f"the training process (pid {pid}) {how}")
        elif died_with_server:
            reason = f"the training process (pid {pid}) died with the server before finishing"
            self._finish(job, "failed", error=("server_restarted", reason))
        else:
            tail = procs.train_log_tail(self._dir(job))
            reason = "the training process exited without finishing" + (
                f"; last log lines:\n{tail}" if tail else ""
            )
            self._finish(job, "failed", error=("training_crashed", reason))

    @staticmethod
    def _restarts(job: dict) -> int:
        return int(job.get("_training_restarts", 0))

    def _requeue(self, job: dict, why: str) -> None:
        """Queue the job to train again from the start. The same data, options and seed give
        the same adapter, so a job that a killed server or the OOM killer interrupted ends as
        it would have, under its own id (the client re-attaches to it, never submits twice)."""
        directory, count = self._dir(job), self._restarts(job) + 1
        (directory / "status.json").unlink(missing_ok=True)
        shutil.rmtree(directory / "output", ignore_errors=True)
        job.update(status="queued", _training_restarts=count)
        for field in ("_pid", "_pid_start"):  # the killed child's: the next launch sets its own
            job.pop(field, None)
        self._save(job)
        limit = self.max_training_restarts
        message = f"{why}; training again from the start (restart {count} of at most {limit})"
        append_event(directory, message, level="warn")

    def _finish(self, job: dict, status: str, message: str = "", error: tuple | None = None):
        job.update(status=status, finished_at=int(time.time()))
        if error is not None:
            code, text, *param = error
            job["error"] = {"code": code, "message": text, "param": param[0] if param else None}
            message = f"Fine-tuning job failed: {text}"
        self._save(job)
        append_event(self._dir(job), message, level="error" if error else "info")

    def _child_alive(self, job: dict) -> bool:
        child = self._children.get(job["id"])
        if child is not None:
            return child.poll() is None
        pid = job.get("_pid")
        return pid is not None and procs.is_alive(pid, job.get("_pid_start"))

    async def _reap(self, job_id: str) -> None:
        """Collect a finished child's exit status, waiting in a thread: a child still tearing down
        must not hold the event loop (every request, health checks included, would wait)."""
        child = self._children.pop(job_id, None)
        if child is not None:
            try:
                await asyncio.to_thread(child.wait, 5)
            except subprocess.TimeoutExpired:
                pass

    # ---- adapters loaded by hand (vLLM-style endpoints) --------------------------------------

    async def load_adapter(self, name: str, path: str) -> None:
        """Load an adapter from disk under `name` and remember it across restarts.

        The name must be a plain model name (letters, digits, `.`, `_`, `:`, `-`, no `..`); the
        folder must lie inside the server's state folder unless the server allows any path.
        """
        check_adapter_request(
            name, path, self.base_name, self.state.root, self.allow_any_adapter_path
        )
        if not Path(path).is_dir():
            raise AdapterError(f"adapter path {path!r} does not exist or is not a directory")
        async with self._lock:
            await self.engine.load_adapter(name, path)
            kind = "lora" if (Path(path) / "adapter_config.json").exists() else "full"
            base = self.engine.models()[0]
            info = {
                "path": str(path),
                "kind": kind,
                "base_model": base,
                "root_name": self.base_name,
            }
            self.adapters[name] = info
            self.state.save_adapters(self.adapters)

    async def unload_adapter(self, name: str) -> None:
        """Unload an adapter and forget it."""
        async with self._lock:
            if name not in self.adapters and name not in self.engine.models()[1:]:
                raise JobError(f"no adapter named {name!r} is loaded", 404, "lora_name")
            await self.engine.unload_adapter(name)
            self.adapters.pop(name, None)
            self.state.save_adapters(self.adapters)
