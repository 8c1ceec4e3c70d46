"""A write-ahead journal of finished model calls, so a killed run never repeats one.

Every completed `complete()` call is appended (one JSON line, flushed and fsync'd) under a key
that hashes everything the answer depends on. On resume the journal is replayed: a call whose key
is present returns the stored texts without reaching the model. A torn last line (the process
was killed mid-write) is ignored.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def call_key(messages: list[dict], model: str, n: int, sampling: Any) -> str:
    payload = {
        "messages": messages,
        "model": model,
        "n": n,
        "sampling": asdict(sampling) if sampling is not None else None,
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()


def read_journal(path: Path) -> dict[str, list[str]]:
    entries: dict[str, list[str]] = {}
    if not path.exists():
        return entries
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            try:
                record = json.loads(line)
                entries[record["key"]] = list(record["texts"])
            except (json.JSONDecodeError, KeyError, TypeError):
                log.warning("call journal %s: ignoring unreadable line %d", path, line_number)
    return entries


class JournaledClient:
    """Wraps a chat client; replays journaled answers and journals new ones."""

    def __init__(self, inner: Any, path: Path) -> None:
        self.inner = inner
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.entries = read_journal(self.path)
        self.replayed = 0
        self._lock = asyncio.Lock()

    async def aclose(self) -> None:
        if hasattr(self.inner, "aclose"):
            await self.inner.aclose()

    async def complete(self, messages: list[dict], model: str, n: int, sampling: Any) -> list[str]:
        key = call_key(messages, model, n, sampling)
        if key in self.entries:
            self.replayed += 1
            return list(self.entries[key])
        texts = await self.inner.complete(messages, model, n, sampling)
        line = json.dumps({"key": key, "texts": list(texts)}, ensure_ascii=False) + "\n"
        async with self._lock:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self.entries[key] = list(texts)
        return texts
