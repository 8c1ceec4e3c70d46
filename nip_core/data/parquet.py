"""Reading dataset Parquet files with errors that name the file and the problem."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


def read_parquet_table(path: Path, required: Sequence[str]) -> pa.Table:
    """Read `path`, raising FileNotFoundError/ValueError that say which file and what is wrong."""
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"dataset file {path} is not a readable Parquet file: {error}") from error
    missing = [column for column in required if column not in table.column_names]
    if missing:
        raise ValueError(f"dataset file {path} lacks required columns {missing}")
    return table


def read_parquet_frame(path: Path, required: Sequence[str]) -> pd.DataFrame:
    """`read_parquet_table` as a pandas DataFrame."""
    return read_parquet_table(path, required).to_pandas()
