"""A write-ahead journal of finished model calls, so a killed run never repeats one.

Every completed `complete()` call is appended (one JSON line) under a key that hashes everything
the answer depends on, and `complete()` returns only once its line is on disk (fsync'd). Lines
are written by group commit: the calls that finish while a write is under way go out together in
the next write, with one fsync, in a worker thread, so the event loop never waits on the disk and
thousands of calls per second cost a few fsyncs. On resume the journal is replayed: a call whose
key is present returns the stored texts without reaching the model; a call killed before its
line was written is simply made again. A torn last line (killed mid-write) is ignored.

On an object store (no appends there) each group commit is one object of its own under
`<journal>.d/`, written by a single PUT, so it appears whole or not at all; reading lists them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from nip_core.agents.chat_client import sampling_key_fields
from nip_core.model_api.jsonl import jsonl_lines

log = logging.getLogger(__name__)


def call_key(messages: list[dict], model: str, n: int, sampling: Any) -> str:
    payload = {
        "messages": messages,
        "model": model,
        "n": n,
        "sampling": sampling_key_fields(sampling) if sampling is not None else None,
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()


def read_journal(path: Path | str, fs: Any = None) -> dict[str, list[str]]:
    """The journal's entries: a local JSONL file, or (with `fs`) its segments on an object store."""
    if fs is not None:
        folder = f"{path}.d"
        segments = sorted(fs.find(folder)) if fs.exists(folder) else []
        chunks = [(segment, fs.cat_file(segment).decode("utf-8")) for segment in segments]
    else:
        path = Path(path)
        chunks = [(str(path), path.read_text(encoding="utf-8"))] if path.exists() else []
    entries: dict[str, list[str]] = {}
    for where, text in chunks:
        for line_number, line in jsonl_lines(text):
            try:
                record = json.loads(line)
                entries[record["key"]] = list(record["texts"])
            except (json.JSONDecodeError, KeyError, TypeError):
                log.warning("call journal %s: ignoring unreadable line %d", where, line_number)
    return entries


class JournaledClient:
    """Wraps a chat client; replays journaled answers and journals new ones.

    `earlier` names other journals (read, never written): a call found there is replayed as
    well, e.g. the switch guard's scoring of a model that an earlier iteration's guard already
    scored on the same episodes with the same call seeds.
    """

    def __init__(
        self, inner: Any, path: Path | str, fs: Any = None, earlier: Sequence[Path | str] = ()
    ) -> None:
        self.inner = inner
        # An object store keeps segments; a local filesystem (or none given) one appended file.
        self.fs = None if fs is None or isinstance(fs, LocalFileSystem) else fs
        self.path: Path | str = str(path) if self.fs is not None else Path(path)
        if self.fs is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.entries = {}
        for other in earlier:
            self.entries.update(read_journal(other, self.fs))
        self.entries.update(read_journal(self.path, self.fs))
        self.replayed = 0
        self.writes = 0  # group commits (one write + fsync each)
        self._pending: list[str] = []
        self._batch_done: asyncio.Future | None = None  # resolves once `_pending` is on disk
        self._writer: asyncio.Task | None = None
        self._file: Any = None

    async def aclose(self) -> None:
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        if self._file is not None:
            self._file.close()
            self._file = None
        if hasattr(self.inner, "aclose"):
            await self.inner.aclose()

    async def complete(self, messages: list[dict], model: str, n: int, sampling: Any) -> list[str]:
        key = call_key(messages, model, n, sampling)
        if key in self.entries:
            self.replayed += 1
            return list(self.entries[key])
        texts = await self.inner.complete(messages, model, n, sampling)
        await self._journal(json.dumps({"key": key, "texts": list(texts)}, ensure_ascii=False))
        self.entries[key] = list(texts)
        return texts

    async def _journal(self, line: str) -> None:
        """Queue `line` for the next group commit and wait until it is durable."""
        self._pending.append(line + "\n")
        if self._batch_done is None:
            self._batch_done = asyncio.get_running_loop().create_future()
        done = self._batch_done
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain())
        await done

    async def _drain(self) -> None:
        while self._pending:
            batch, done = self._pending, self._batch_done
            self._pending, self._batch_done = [], None
            try:
                await asyncio.to_thread(self._write, "".join(batch))
            except Exception as error:  # every waiter of this batch sees the failure
                done.set_exception(error)
            else:
                done.set_result(None)

    def _write(self, text: str) -> None:
        if self.fs is not None:  # one object per group commit: a single PUT
            segment = f"{self.path}.d/{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.jsonl"
            self.fs.pipe_file(segment, text.encode("utf-8"))
            self.writes += 1
            return
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._file.write(text)
        self._file.flush()
        os.fsync(self._file.fileno())
        self.writes += 1
