"""Did a resumed run keep what it had written? For engines whose answers differ run to run.

vLLM's seeded sampling on CPU is not reproducible from one server to the next (a batch of other
sizes changes the bf16 numerics: two uninterrupted runs of the same command diverge mid-reply),
so a killed vLLM run cannot be compared byte for byte with a separate reference run. What a kill
must not do can still be checked exactly:

- `kept`: every file of the iteration folder as it was just after the kill is still there
  afterwards with the same bytes: a finished stage is never redone, a Parquet file never
  rewritten. Two kinds may grow: a call journal (its records at the kill are all still there)
  and `manifest.json` (the stages recorded at the kill are recorded unchanged).
- `same_shape`: the run ends with the reference's files and, per Parquet file, the same number
  of rows (a lost or duplicated shard, episode or pair shows here).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pyarrow.parquet as pq

from bench.soak_compare import MANIFEST, all_files, is_journal, journal_records


def finished_files(folder: Path) -> set[str]:
    return {r for r in all_files(folder) if not r.rsplit("/", 1)[-1].startswith(".tmp-")}


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every finished file under `folder` (temporary `.tmp-*` files of atomic writes aside)."""
    found = {}
    for relative in finished_files(folder):
        try:
            found[relative] = (folder / relative).read_bytes()
        except OSError:  # renamed or removed while we looked: not a finished file
            continue
    return found


def kept(before: Mapping[str, bytes], folder: Path) -> list[str]:
    """ "path: why" for each file of `before` that `folder` lost, rewrote or cut short."""
    problems = []
    for relative, data in sorted(before.items()):
        path = folder / relative
        if not path.exists():
            problems.append(f"{relative}: gone after the kill")
            continue
        now = path.read_bytes()
        if now == data:
            continue
        if is_journal(relative):
            lost = Counter(journal_records(data)[0]) - Counter(journal_records(now)[0])
            if lost:
                problems.append(f"{relative}: {sum(lost.values())} journal records lost")
        elif relative.rsplit("/", 1)[-1] == MANIFEST:
            old, new = json.loads(data).get("stages", {}), json.loads(now).get("stages", {})
            changed = sorted(stage for stage, entry in old.items() if new.get(stage) != entry)
            if changed:
                problems.append(f"{relative}: stages recorded again: {', '.join(changed)}")
        else:
            problems.append(f"{relative}: rewritten after the kill")
    return problems


def same_shape(reference: Path, run: Path) -> list[str]:
    """ "path: why" for files only one side has and Parquet files of another row count."""
    want, got = finished_files(reference), finished_files(run)
    problems = [f"{r}: missing" for r in sorted(want - got)]
    problems += [f"{r}: not in the reference" for r in sorted(got - want)]
    for relative in sorted(want & got):
        if relative.endswith(".parquet"):
            rows = [pq.ParquetFile(side / relative).metadata.num_rows for side in (reference, run)]
            if rows[0] != rows[1]:
                problems.append(f"{relative}: {rows[1]} rows, the reference {rows[0]}")
    return problems
