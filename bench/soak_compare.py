"""Is a disturbed run the same as an undisturbed one? File-by-file and row-by-row comparison.

Shared by `bench/kill_soak.py`, `bench/fault_soak.py` and `tests/test_soaks.py`. Every file of
the reference's run folder (`<root>/<run>/`: `hyper_params.json` and every iteration file) must
exist in the other run with the same bytes, and the other run must hold no file more. Only four
kinds of file are compared differently, because their bytes may legitimately differ:

- `manifest.json`: compared as JSON without each stage's `seconds` (its wall time) and the
  rollout stage's `replayed_calls` (how many answers a resumed run took from its call journal);
  each file checksum it lists must match that run's file (the files themselves are compared
  below); every other field must be equal.
- call journals (`*calls-*.jsonl`): compared as their (request key, answers) records. Lines are
  appended in the order calls finish, which a resume changes; a line cut short by a kill is
  skipped by the pipeline's reader and counted here as a torn line, not as a difference.
- fine-tune job ids: a real server draws them at random (`ftjob-<hex>`), and the fine-tuned
  model's name contains it; `job_ids` maps the run's ids to the reference's before JSON and JSONL
  files are compared (Parquet files never hold them and stay byte for byte). A journal key hashes
  the model name, so with `job_ids` given, the records whose key only one side has (the calls
  to a fine-tuned model) are compared by their answers alone.

- `provenance.json`: one record per invocation of the run (commit, machine, command, start and
  end), so a run killed and resumed holds more records than one that ran through; it must be
  valid, every record complete, and its last invocation must have finished.

Rows: every Parquet file and every JSONL line file (datasets, journals) is also compared as a
multiset of rows, so a difference is counted as lost rows (in the reference, missing from the
run), duplicate rows (more copies than the reference has) and extra rows (not in the reference).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from nip_core.model_api.jsonl import jsonl_lines
from nip_core.run.provenance import PROVENANCE_FILE, missing_fields

MANIFEST = "manifest.json"
VOLATILE_STAGE_FIELDS = ("seconds",)  # per stage: its wall time
VOLATILE_INFO_FIELDS = ("replayed_calls",)  # per stage info: answers replayed from the journal
VOLATILE_MANIFEST_FIELDS = ("server_restarts",)  # restarts of the run's server: the soak's own


@dataclass
class Comparison:
    """What differs between a run and its reference; `problems` must be 0."""

    files: int = 0
    differing: list[str] = field(default_factory=list)  # "path: why"
    lost_rows: int = 0
    duplicate_rows: int = 0
    extra_rows: int = 0
    torn_journal_lines: int = 0

    @property
    def problems(self) -> int:
        return len(self.differing) + self.lost_rows + self.duplicate_rows + self.extra_rows

    def summary(self) -> str:
        return (
            f"files compared {self.files}, differing files {len(self.differing)}, lost rows "
            f"{self.lost_rows}, duplicate rows {self.duplicate_rows}, extra rows "
            f"{self.extra_rows} (torn journal lines skipped: {self.torn_journal_lines})"
        )


def is_journal(relative: str) -> bool:
    name = relative.rsplit("/", 1)[-1]
    return name.endswith(".jsonl") and (name.startswith("calls-") or "-calls-" in name)


def journal_records(data: bytes) -> tuple[list[str], int]:
    """(one "key answers" string per readable line, torn lines), as the pipeline reads them."""
    rows, torn = [], 0
    for _, line in jsonl_lines(data.decode("utf-8", "replace")):
        try:
            record = json.loads(line)
            rows.append(json.dumps([record["key"], record["texts"]], ensure_ascii=False))
        except (json.JSONDecodeError, KeyError, TypeError):
            torn += 1
    return rows, torn


def count_rows(reference: Sequence[str], run: Sequence[str]) -> tuple[int, int, int]:
    """(lost, duplicate, extra) rows of `run` against `reference`, as multisets."""
    want, got = Counter(reference), Counter(run)
    lost = sum(max(0, n - got[row]) for row, n in want.items())
    duplicate = sum(max(0, n - want[row]) for row, n in got.items() if row in want)
    extra = sum(n for row, n in got.items() if row not in want)
    return lost, duplicate, extra


def without_volatile(manifest: dict, folder: Path) -> dict:
    """The manifest less the fields that may differ between equal runs (see module doc); each
    file checksum becomes whether it matches the file in `folder`."""
    for name in VOLATILE_MANIFEST_FIELDS:
        manifest.pop(name, None)
    for stage in manifest.get("stages", {}).values():
        for name in VOLATILE_STAGE_FIELDS:
            stage.pop(name, None)
        files = stage.get("files")
        if isinstance(files, dict):
            stage["files"] = {path: checksum_ok(folder / path, sha) for path, sha in files.items()}
        info = stage.get("info")
        if isinstance(info, dict):
            for name in VOLATILE_INFO_FIELDS:
                info.pop(name, None)
    return manifest


def checksum_ok(path: Path, sha: str) -> str:
    try:
        return "ok" if hashlib.sha256(path.read_bytes()).hexdigest() == sha else "mismatch"
    except FileNotFoundError:
        return "missing"


def loosened(mine: list[str], theirs: list[str]) -> list[str]:
    """Journal rows of `mine`, those whose key `theirs` lacks reduced to their answers."""
    keys = {json.loads(row)[0] for row in theirs}
    return [row if json.loads(row)[0] in keys else json.dumps(json.loads(row)[1]) for row in mine]


def journal_rows(want: bytes, got: bytes, loose: bool) -> tuple[list[str], list[str], int]:
    """(reference rows, run rows, torn run lines) of a call journal; `loose`: see module doc."""
    (ref, _), (run, torn) = journal_records(want), journal_records(got)
    if loose:
        ref, run = loosened(ref, run), loosened(run, ref)
    return ref, run, torn


def with_job_ids(data: bytes, job_ids: Mapping[str, str]) -> bytes:
    for theirs, ours in job_ids.items():
        data = data.replace(theirs.encode(), ours.encode())
    return data


def files_equal(ref: Path, run: Path, relative: str, job_ids: Mapping[str, str]) -> str | None:
    """None when equal, else why not."""
    want, got = ref.read_bytes(), run.read_bytes()
    if relative.endswith((".json", ".jsonl")):
        got = with_job_ids(got, job_ids)
    if relative.endswith("-steps.parquet"):  # names its job in metadata, base64 inside Arrow's
        same = steps_content(ref) == steps_content(run, job_ids)
        return None if same else "training steps differ"
    if relative.rsplit("/", 1)[-1] == MANIFEST:
        try:
            same = without_volatile(json.loads(want), ref.parent) == without_volatile(
                json.loads(got), run.parent
            )
        except json.JSONDecodeError:
            return "not valid JSON"
        return (
            None
            if same
            else "manifest differs (beyond stage seconds, replayed calls, server restarts)"
        )
    if relative == PROVENANCE_FILE:
        return provenance_problem(got)
    if is_journal(relative):
        ref_rows, run_rows, _ = journal_rows(want, got, bool(job_ids))
        return None if sorted(ref_rows) == sorted(run_rows) else "call journal records differ"
    return None if want == got else f"bytes differ ({len(want)} vs {len(got)} bytes)"


def provenance_problem(data: bytes) -> str | None:
    """Why a run's provenance file is not a complete record of a finished run, or None."""
    try:
        invocations = json.loads(data)["invocations"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return "provenance is not valid"
    if not invocations or any(missing_fields(r) for r in invocations):
        return "provenance records are incomplete"
    return None if invocations[-1].get("outcome") == "finished" else "the last run did not finish"


def steps_content(path: Path, job_ids: Mapping[str, str] | None = None) -> tuple:
    """A training-steps file's rows and its own metadata, the run's job ids mapped."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    metadata = {
        k.decode(): with_job_ids(v, job_ids or {}).decode()
        for k, v in (table.schema.metadata or {}).items()
        if not k.startswith((b"ARROW:", b"pandas"))
    }
    return table.to_pylist(), metadata


def all_files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def compare_runs(ref: Path, run: Path, job_ids: Mapping[str, str] | None = None) -> Comparison:
    """Compare run folder `run` with the reference run folder `ref` (see the module doc)."""
    job_ids = job_ids or {}
    result = Comparison()
    want, got = all_files(ref), all_files(run)
    for relative in sorted(want | got):
        result.files += 1
        if relative not in got:
            result.differing.append(f"{relative}: missing")
        elif relative not in want:
            result.differing.append(f"{relative}: not in the reference")
        elif why := files_equal(ref / relative, run / relative, relative, job_ids):
            result.differing.append(f"{relative}: {why}")
        if relative not in want:
            continue
        rows = row_sets(ref / relative, run / relative, relative, job_ids)
        if rows is None:
            continue
        lost, duplicate, extra = count_rows(rows[0], rows[1])
        result.lost_rows += lost
        result.duplicate_rows += duplicate
        result.extra_rows += extra
        result.torn_journal_lines += rows[2]
    return result


def row_sets(
    ref: Path, run: Path, relative: str, job_ids: Mapping[str, str]
) -> tuple[list[str], list[str], int] | None:
    """(reference rows, run rows, torn lines) of a row file, None for other files."""
    got = run.read_bytes() if run.exists() else b""
    if is_journal(relative):
        return journal_rows(ref.read_bytes(), got, bool(job_ids))
    if relative.endswith(".jsonl"):
        want = ref.read_text(encoding="utf-8").splitlines()
        return want, with_job_ids(got, job_ids).decode("utf-8").splitlines(), 0
    if relative.endswith(".parquet"):
        return parquet_rows(ref), parquet_rows(run) if run.exists() else [], 0
    return None


def parquet_rows(path: Path) -> list[str]:
    """Every row of a Parquet file as canonical JSON; none for a file that cannot be read."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException):
        return []
    return [json.dumps(row, sort_keys=True, default=repr) for row in table.to_pylist()]


def recorded_jobs(iteration_dir: Path) -> dict[str, list[str]]:
    """Group -> every fine-tune job its record names (the current one, then the failed ones)."""
    jobs = {}
    for record in sorted((iteration_dir / "fine_tune").glob("*.json")):
        state = json.loads(record.read_text())["state"]
        ids = [state.get("fine_tune_job_id")] + [j["job_id"] for j in state.get("failed_jobs", [])]
        jobs[record.stem] = [i for i in ids if i]
    return jobs


def job_id_map(ref_iteration: Path, run_iteration: Path) -> dict[str, str]:
    """The run's current job id of each group -> the reference's (for `compare_runs`)."""
    ref, run = recorded_jobs(ref_iteration), recorded_jobs(run_iteration)
    return {
        run[g][0]: ref[g][0]
        for g in ref.keys() & run.keys()
        if ref[g] and run[g] and ref[g][0] != run[g][0]
    }


def duplicate_jobs(jobs: Mapping[str, Sequence[str]]) -> int:
    """Jobs beyond the first of each group (one job per trainable group is the target)."""
    return sum(max(0, len(set(ids)) - 1) for ids in jobs.values())
