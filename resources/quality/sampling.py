"""Seeded row samples of published partitions, and their row counts from the files' footers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from resources.storage import DataStore


def sample_positions(rows: int, size: int, seed: int) -> np.ndarray:
    """``size`` distinct row positions out of ``rows``, sorted, the same for the same seed."""
    if size <= 0:
        return np.zeros(0, np.int64)
    if rows <= size:
        return np.arange(rows)
    return np.sort(np.random.default_rng(seed).choice(rows, size=size, replace=False))


class PositionCursor:
    """Walks sorted row positions along a stream read in order: for the next ``rows`` rows,
    :meth:`advance` gives the positions that fall in them, local to them."""

    def __init__(self, positions: np.ndarray):
        self.positions, self.seen = positions, 0

    def advance(self, rows: int) -> np.ndarray:
        lo, hi = np.searchsorted(self.positions, [self.seen, self.seen + rows])
        local = self.positions[lo:hi] - self.seen
        self.seen += rows
        return local


def sample_output(
    store: DataStore, asset: str, date: str, size: int, seed: int, columns: list[str] | None = None
) -> pd.DataFrame:
    """A seeded random sample of a published partition's rows, as pandas for GE.

    Row counts come from the files' footers; then one row group at a time is read and only its
    sampled rows are kept, so memory stays at a row group whatever the partition's size (read
    whole, a large partition costs its full size in memory to sample a few thousand rows).
    """
    files = store.output_files(asset, date)
    if not files:
        return pd.DataFrame(columns=columns or [])
    # The table's files also hold its day column: the sample is of the output's own columns.
    columns = columns or store.output_columns(asset)
    readers = [pq.ParquetFile(f, filesystem=store.fs, pre_buffer=False) for f in files]
    groups = [
        (r, g, r.metadata.row_group(g).num_rows) for r in readers for g in range(r.num_row_groups)
    ]
    cursor = PositionCursor(sample_positions(sum(n for _, _, n in groups), size, seed))
    taken = []
    for reader, group, rows in groups:
        local = cursor.advance(rows)
        if len(local):
            taken.append(reader.read_row_group(group, columns=columns).take(pa.array(local)))
    if not taken:
        empty = readers[0].schema_arrow.empty_table()
        return (empty.select(columns) if columns else empty).to_pandas()
    return pa.concat_tables(taken).to_pandas()


class StreamedSample:
    """The rows at :func:`sample_positions` of an output, taken while its batches stream past in
    order, so the checks need not read the published partition back: the same rows
    :func:`sample_output` would read, without a second pass over the files. Complete only when
    every output row went past, i.e. not on an attempt that resumed finished shards;
    :meth:`frame` is None then and the caller reads them back.
    """

    def __init__(self, rows: int, size: int, seed: int):
        self.rows = rows
        self._cursor = PositionCursor(sample_positions(rows, size, seed))
        self._parts: list[pa.Table] = []

    def add(self, out: pa.Table) -> None:
        local = self._cursor.advance(out.num_rows)
        if len(local):
            self._parts.append(out.take(pa.array(local)))

    def frame(self, rows_out: int) -> pd.DataFrame | None:
        if not self._parts or self._cursor.seen != rows_out or rows_out != self.rows:
            return None
        return pa.concat_tables(self._parts).to_pandas()


def published_rows(store: DataStore, asset: str, date: str) -> int:
    """Rows in a published partition, from its files' footers (no data is read)."""
    files = store.output_files(asset, date)
    if not files:
        return 0
    return ds.dataset(files, filesystem=store.fs, format="parquet").count_rows()
