"""The reference library's `lrhammond/buggy-apps` hub dataset, read from local Parquet files.

Processing follows nip: keep one APPS difficulty (and drop moderation-flagged rows), then for
k = 0, 1, ... emit every row's k-th correct solution (y=1), and afterwards every row's k-th buggy
solution (y=0), numbering the result 0..N-1. nip's buggy loop tested `len(solutions)` instead of
`len(buggy_solutions)` (nip_behaviour.md §8 item 23), which indexes past the end of a shorter
buggy list; here each loop tests its own list.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from nip_core.data.parquet import read_parquet_frame
from nip_core.data.stable import prover_stance

HUB_NAME = "lrhammond/buggy-apps"
HUB_COLUMNS = ("difficulty", "flags", "question", "solutions", "buggy_solutions")
DIFFICULTIES = ("introductory", "interview", "competition")
OUTPUT_COLUMNS = ("id", "question", "solution", "y", "prover_stance")


def split_file(path: Path, split: str) -> Path:
    """The Parquet file for `split`: `path` itself, or `{split}.parquet` / `{split}-*.parquet`
    inside the directory `path` (or its `data/` folder, the hub's layout)."""
    if not path.exists():
        raise FileNotFoundError(f"buggy-apps path {path} does not exist")
    if path.is_file():
        return path
    for folder in (path, path / "data"):
        matches = sorted(folder.glob(f"{split}.parquet")) + sorted(
            folder.glob(f"{split}-*.parquet")
        )
        if matches:
            return matches[0]
    raise FileNotFoundError(f"no {split}.parquet (or {split}-*.parquet) in directory {path}")


def read_hub_split(path: str | Path | None, split: str) -> pd.DataFrame:
    """The raw hub rows of one split, from `path` or, failing that, the `datasets` cache/hub."""
    if path is not None:
        return read_parquet_frame(split_file(Path(path), split), HUB_COLUMNS)
    try:
        import datasets  # optional and slow to import: only needed here

        frame = datasets.load_dataset(HUB_NAME, split=split).to_pandas()
    except Exception as error:  # any failure means "not available offline"
        raise FileNotFoundError(
            f"could not load {HUB_NAME!r} split {split!r} with the `datasets` library ({error}); "
            "download it once and pass its local Parquet file or directory as `path` "
            "(or DatasetParameters.local_path)"
        ) from error
    missing = [column for column in HUB_COLUMNS if column not in frame.columns]
    if missing:
        raise ValueError(f"{HUB_NAME} split {split!r} lacks columns {missing}")
    return frame


def process_buggy_apps(
    hub: pd.DataFrame, difficulty: str = "interview", exclude_flagged: bool = True
) -> pd.DataFrame:
    """Datapoints (id, question, solution, y, prover_stance) from raw hub rows.

    >>> hub = pd.DataFrame({"difficulty": ["interview"], "flags": [""], "question": ["Q"],
    ...     "solutions": [[{"solution": "a"}, {"solution": "b"}]],
    ...     "buggy_solutions": [[{"solution": "c"}]]})
    >>> process_buggy_apps(hub)[["solution", "y"]].values.tolist()
    [['a', 1], ['b', 1], ['c', 0]]
    """
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    keep = hub["difficulty"] == difficulty
    if exclude_flagged:
        keep &= ~hub["flags"].map(_is_flagged)
    rows = hub[keep]
    questions = rows["question"].tolist()
    correct = _k_loop(questions, [_texts(v, "solutions") for v in rows["solutions"]], 1)
    buggy = _k_loop(questions, [_texts(v, "buggy_solutions") for v in rows["buggy_solutions"]], 0)
    records = [
        {"id": index, "question": q, "solution": s, "y": y, "prover_stance": prover_stance(s)}
        for index, (q, s, y) in enumerate(correct + buggy)
    ]
    frame = pd.DataFrame.from_records(records, columns=list(OUTPUT_COLUMNS))
    return frame.astype({"id": "int64", "y": "int64", "prover_stance": "int64"})


def _k_loop(
    questions: Sequence[str], solutions: Sequence[list[str]], label: int
) -> list[tuple[str, str, int]]:
    """k-th solution of every row that has one, for k = 0, 1, ... (the reference's order)."""
    longest = max((len(texts) for texts in solutions), default=0)
    return [
        (question, texts[k], label)
        for k in range(longest)
        for question, texts in zip(questions, solutions, strict=True)
        if len(texts) > k
    ]


def _texts(entries: Any, column: str) -> list[str]:
    """The `solution` strings of one row's list of solution records (None means no records)."""
    if entries is None:
        return []
    texts = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("solution"), str):
            raise ValueError(f"each entry of {column!r} must be a record with a 'solution' string")
        texts.append(entry["solution"])
    return texts


def _is_flagged(flags: Any) -> bool:
    """Non-empty `flags` means the moderation API flagged the row."""
    if flags is None or (isinstance(flags, float) and pd.isna(flags)):
        return False
    return len(flags) > 0
