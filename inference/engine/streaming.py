"""Reading parquet as a stream whose memory does not grow with the file.

pyarrow's defaults are tuned for reading whole tables fast, not for streaming big partitions
into a slower consumer (a model):

- ``pre_buffer=True`` (the default) coalesces and issues the reads of every row group the
  scan will touch, so Arrow's pool holds the whole scan at once; it is off here.
- a dataset scanner (``Dataset.to_batches``) keeps reading ahead while the consumer is busy,
  so even with a small ``batch_readahead`` its peak grows with the file. A pull-based reader
  reads a row group only when the next batch is asked for; the engine's prefetch thread
  already overlaps that read with compute.

Memory is then one row group (plus the batches in flight), whatever the file's size. Columns
of a large row group are decoded on Arrow's threads, which is faster and changes no memory
bound. The measurements behind these choices: docs/benchmarks.md, "Streaming parquet".

Many small files (one per upstream task) cost per file, not per row: :func:`iter_parquet_files`
reads them whole, a batch's worth of rows ahead, on a few threads, and the caller joins their
batches (``inference.engine.batching.coalesce``), so memory is still about a batch.

Timestamps written without a time zone are read as wall-clock time in a zone the data owner
names (:func:`localize`). A parquet timestamp without a time zone (Arrow ``timestamp[us]``, Parquet
``isAdjustedToUTC=false``) is a clock reading, not an instant. Casting it to
``timestamp[us, tz=UTC]`` reads it as UTC, which moves a local day's evening rows into the next
UTC day. Landing contracts therefore reject such columns unless the dataset's landing timezone
says whose clock it is; this module turns the readings into instants in that zone.

At a daylight-saving change a reading may not name one instant:

- ambiguous (the hour repeated when clocks go back): the earlier instant, still summer time,
  as Python's ``fold=0`` and Java's ``ZonedDateTime`` choose; the reading cannot say which.
- nonexistent (the hour skipped when clocks go forward): an error naming the column and the
  first such reading, since a clock in that zone never shows it: the data is not that zone's
  wall-clock time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

# Row groups below this many rows are decoded on the calling thread: handing each column of a
# small row group to Arrow's pool costs more than decoding it.
THREADED_ROWS = 32_768


@dataclass(frozen=True)
class ParquetRead:
    """What to read from parquet files and how the batches come out.

    Args:
        columns: the columns to read (all when None).
        batch_size: rows per batch at most (a row group boundary may cut one shorter).
        schema: cast each batch to this schema's types for the columns read, or None.
        filesystem: where the files are (local when None).
        timezone: the zone whose wall-clock time naive timestamp columns are, where ``schema``
            wants them with a time zone (see :func:`localize`); None casts them as UTC.
        exact: columns read (``columns`` must name them) whose values as stored are also kept,
            as text, in a column ``<name>_exact`` after the others (see :func:`exact_text`).
    """

    columns: list[str] | None = None
    batch_size: int = 65_536
    schema: pa.Schema | None = None
    filesystem: pafs.FileSystem | None = None
    timezone: str | None = None
    exact: tuple[str, ...] = ()

    def finish(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A batch as read from a file, cast to ``schema``, with its ``exact`` columns' text."""
        texts = [(exact_name(name), exact_text(batch[name])) for name in self.exact]
        if self.schema is not None:
            batch = _cast(batch, self.schema, self.timezone)
        for name, text in texts:
            batch = batch.append_column(name, text)
        return batch


def exact_name(column: str) -> str:
    """The column holding ``column``'s exact values as text (see :func:`exact_text`)."""
    return f"{column}_exact"


def exact_text(values: pa.Array) -> pa.Array:
    """A column's values as stored, as text, where reading it as the contract's float may round
    them: a ``decimal(p, s)`` (Spark's money columns) with its scale, ``12.30`` for 12.30;
    null where the stored value is a float, which the cast column then holds exactly.

    A double keeps about 15 significant digits, so an amount of 10^13 or more loses its cents;
    the text keeps them wherever the row is written out (alerts, quarantine)."""
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if pa.types.is_decimal(values.type):
        return pc.cast(values, pa.string())
    return pa.nulls(len(values), pa.string())


def iter_parquet(
    files: str | Sequence[str],
    read: ParquetRead = ParquetRead(),
    footers: Sequence[pq.FileMetaData | None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Streams record batches from parquet files, one row group in memory at a time.

    Args:
        files: a file or a list of files, read in order.
        read: the columns, batch size, schema, filesystem and time zone.
        footers: the files' footers when already read (one per file), so they are not read again.

    Raises:
        NonexistentTimeError: with ``read.timezone``, a reading that the zone's clocks skip.
    """
    paths = [files] if isinstance(files, str) else list(files)
    for path, footer in zip(paths, footers or [None] * len(paths), strict=True):
        reader = pq.ParquetFile(
            path, metadata=footer, pre_buffer=False, filesystem=read.filesystem, memory_map=False
        )
        meta = reader.metadata
        threads = meta.num_rows >= THREADED_ROWS * max(1, meta.num_row_groups)
        batches = reader.iter_batches(
            batch_size=read.batch_size, columns=read.columns, use_threads=threads
        )
        for batch in batches:
            yield read.finish(batch)


# Small files are read whole on a few threads, ahead of the consumer: a file costs a fixed CPU
# time to open and decode whatever its rows, which the threads overlap; a few threads overlap
# all there is, and Arrow's own threads do not help at that size (see THREADED_ROWS).
READ_AHEAD_THREADS = min(4, os.cpu_count() or 1)


def iter_parquet_files(
    files: Sequence[str],
    rows: Sequence[int],
    read: ParquetRead = ParquetRead(),
    footers: Sequence[pq.FileMetaData | None] | None = None,
    threads: int = READ_AHEAD_THREADS,
    pre_buffer: bool = False,
) -> Iterator[tuple[str, Iterator[pa.RecordBatch]]]:
    """Each file, in order, with the stream of its batches (as :func:`iter_parquet` makes them).

    A file of fewer than ``THREADED_ROWS`` rows is read whole on one of ``threads`` threads,
    started ahead of the consumer while the files started and not yet consumed hold fewer than
    ``read.batch_size`` rows; a larger file streams one row group at a time when its turn comes. So
    memory stays at a batch's worth of small files, or one row group of a large one. A file
    that cannot be read raises when its own batches are iterated, so the caller can name it.

    Args:
        files: the files, read in this order.
        rows: their row counts, one per file.
        read: as for :func:`iter_parquet`.
        footers: their footers when already read (None for one: its reader reads it).
        threads: threads reading small files (1: each is read when its turn comes).
        pre_buffer: fetch a small file's column chunks in one coalesced read (object stores,
            where each read is a round trip).
    """

    fs = read.filesystem or pafs.LocalFileSystem()

    def read_whole(path: str, footer: pq.FileMetaData | None) -> list[pa.RecordBatch]:
        # Decoded and cast on the reading thread, so the consumer's thread only collects them.
        # An opened file, not a path: resolving the path is a tenth of a small file's cost.
        with fs.open_input_file(path) as source:
            reader = pq.ParquetFile(source, metadata=footer, pre_buffer=pre_buffer)
            table = reader.read(columns=read.columns, use_threads=False)
        return [read.finish(b) for b in table.to_batches(read.batch_size)]

    def stream(path: str, footer: pq.FileMetaData | None) -> Iterator[pa.RecordBatch]:
        return iter_parquet(path, read, footers=[footer])

    def unpack(started: Future) -> Iterator[pa.RecordBatch]:
        yield from started.result()

    footers = footers or [None] * len(files)
    small = [n < THREADED_ROWS for n in rows]
    if threads <= 1 or not any(small):
        for path, footer in zip(files, footers, strict=True):
            yield path, stream(path, footer)
        return
    pool = ThreadPoolExecutor(threads, thread_name_prefix="parquet-read-ahead")
    started: dict[int, Future] = {}
    rows_started, following = 0, 0
    try:
        for i, (path, footer) in enumerate(zip(files, footers, strict=True)):
            if not small[i]:
                yield path, stream(path, footer)
                continue
            following = max(following, i)
            while following < len(files) and small[following]:
                if following > i and rows_started >= read.batch_size:
                    break
                started[following] = pool.submit(read_whole, files[following], footers[following])
                rows_started += rows[following]
                following += 1
            rows_started -= rows[i]
            yield path, unpack(started.pop(i))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _target(schema: pa.Schema, names: list[str]) -> pa.Schema:
    return pa.schema([schema.field(name) for name in names])


def _cast(batch: pa.RecordBatch, schema: pa.Schema, timezone: str | None) -> pa.RecordBatch:
    target = _target(schema, batch.schema.names)
    if batch.schema == target:
        return batch
    if timezone is not None:
        batch = localize(batch, target, timezone)
    for i, want in enumerate(target):
        found = batch.column(i)
        if pa.types.is_floating(want.type) and pa.types.is_decimal(found.type):
            batch = batch.set_column(i, want.name, decimal_as_float(found))
    return batch.cast(target)


# Powers of ten up to 10^22 are exact doubles.
_EXACT_POWER = 22


def decimal_as_float(values: pa.Array) -> pa.Array:
    """The nearest double to each decimal, as parsing its text would give.

    Arrow's own cast scales by a rounded power of ten and misses the nearest double for many
    values (decimal 12.34 becomes 12.340000000000002; how many: docs/benchmarks.md, "Decimal
    amounts"), so a float read from a decimal would differ from the same amount landed as a
    float. Dividing the unscaled integer by 10^scale is one correctly rounded operation when
    both are exact doubles (precision up to 18 digits and an unscaled value within 2^53:
    amounts below 90 trillion at two places); other decimals go through their text."""
    kind = values.type
    if kind.precision <= 18 and 0 <= kind.scale <= _EXACT_POWER:
        # A decimal of up to 18 digits fits int64: the low word of its 128-bit two's complement.
        words = np.frombuffer(values.buffers()[1], np.int64)
        unscaled = words[2 * values.offset :: 2][: len(values)]
        valid = values.is_valid().to_numpy(zero_copy_only=False)
        if np.abs(unscaled[valid]).max(initial=0) <= 2**53:
            floats = unscaled.astype(np.float64) / 10.0**kind.scale
            return pa.array(floats, pa.float64(), mask=None if values.null_count == 0 else ~valid)
    return pc.cast(pc.cast(values, pa.string()), pa.float64())


class NonexistentTimeError(ValueError):
    """A wall-clock reading that the zone's clocks skip (the change to summer time)."""


@dataclass(frozen=True)
class LandingTimezones:
    """The zone whose wall-clock time each landing dataset's naive timestamps are.

    Args:
        default: the zone for every dataset not named in ``per_dataset``; None rejects them.
        per_dataset: dataset name -> zone.
    """

    default: str | None = None
    per_dataset: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str | None) -> LandingTimezones:
        """Reads ``America/New_York`` (every dataset), ``transactions=America/New_York,
        documents=Europe/Paris`` (per dataset) or both mixed; empty or None: none.

        Raises:
            ValueError: an unknown zone, an empty entry or two defaults, naming the entry.
        """
        default, per_dataset = None, {}
        for entry in (spec or "").split(","):
            entry = entry.strip()
            if not entry:
                continue
            dataset, _, zone = entry.rpartition("=")
            zone, dataset = check_zone(zone.strip(), entry), dataset.strip()
            if dataset:
                per_dataset[dataset] = zone
            elif default is not None:
                raise ValueError(
                    f"landing timezone {spec!r}: two zones for every dataset ({default}, {zone}); "
                    "name the dataset for one of them (dataset=Zone)"
                )
            else:
                default = zone
        return cls(default, per_dataset)

    def for_dataset(self, dataset: str) -> str | None:
        return self.per_dataset.get(dataset, self.default)


def check_zone(zone: str, entry: str | None = None) -> str:
    """Returns ``zone`` if Arrow's time zone database knows it, else raises ValueError."""
    try:
        pc.assume_timezone(pa.array([0], pa.timestamp("us")), zone)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(
            f"landing timezone {entry or zone!r}: unknown time zone {zone!r} "
            "(expected an IANA name such as America/New_York, or UTC)"
        ) from exc
    return zone


def is_naive_for(found: pa.DataType, expected: pa.DataType) -> bool:
    """Whether ``found`` is a timestamp without a time zone where ``expected`` has one."""
    return (
        pa.types.is_timestamp(found)
        and pa.types.is_timestamp(expected)
        and found.tz is None
        and expected.tz is not None
    )


def localize(batch: pa.RecordBatch, target: pa.Schema, zone: str) -> pa.RecordBatch:
    """Reads the batch's naive timestamp columns that ``target`` wants with a time zone as
    ``zone``'s wall-clock time; a cast to ``target`` then keeps the instants.

    Raises:
        NonexistentTimeError: a reading the zone's clocks skip, naming the column and the first.
    """
    columns = list(batch.columns)
    for i, name in enumerate(batch.schema.names):
        if name in target.names and is_naive_for(columns[i].type, target.field(name).type):
            columns[i] = _assume(columns[i], name, zone)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _assume(column: pa.Array, name: str, zone: str) -> pa.Array:
    try:
        return pc.assume_timezone(column, zone, ambiguous="earliest", nonexistent="raise")
    except pa.ArrowInvalid:
        early = pc.assume_timezone(column, zone, ambiguous="earliest", nonexistent="earliest")
        late = pc.assume_timezone(column, zone, ambiguous="earliest", nonexistent="latest")
        skipped = pc.fill_null(pc.not_equal(early, late), False)
        gaps = column.filter(skipped)
        if not len(gaps):
            raise
        raise NonexistentTimeError(
            f"column '{name}' holds {len(gaps)} wall-clock time(s) that do not exist in {zone}, "
            f"the first {gaps[0].as_py()}: its clocks skip them when summer time starts, so "
            f"these timestamps are not wall-clock time in {zone}"
        ) from None
