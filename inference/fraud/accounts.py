"""``fraud_scores`` cut by account: each shard holds every row of its accounts.

Per-account features (counts, usual amount, merchants and countries seen, bursts) need all of an
account's rows. A shard that holds whole accounts builds its own profile from its rows alone, so memory follows
the shard, not the day (in the step's process as on a worker), and shards are independent.

Two figures are day-wide: each country's share of the day's transactions and each merchant's
reach in accounts. Both are sums over shards (accounts never span two), so the driver adds them
up before any shard is scored and they travel with the job; a shard's profile then gives every
row exactly the features the whole-day profile gives it (rows keep their input order within an
account, so even float sums are the same).

The driver streams the day twice, both in bounded memory: once to write each row into its
shard's file (``crc32(account_id) % shards``, stable across processes and machines), counting
countries; once over the shard files, one at a time, for the merchants' reach.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from inference.engine.batching import Prefetcher
from inference.engine.predictor import ShardCut
from inference.engine.quarantine import QuarantinePlan
from inference.engine.shard_worker import ShardInput
from inference.fraud.profile import PROFILE_COLUMNS, PartitionProfile, ProfileBuilder

POSITION = "_position"
# Rows held back across all shards while the day is written into shard files (a few tens of
# MB of the scored columns, whatever the day's size), so each shard's file gets few, large
# row groups rather than one per shard per input batch.
BUFFER_ROWS = 500_000
MIN_ROW_GROUP = 1_024
# The shard files are scratch, written and read back once or twice on this machine: Arrow's own
# format, uncompressed, costs the least time to write and read (no encoding, no codec) for under
# twice lz4's disk (docs/benchmarks.md, "The engine after the scoring runner").
SCRATCH_FORMAT = ipc.IpcWriteOptions()


def shard_count(rows: int, shard_rows: int) -> int:
    """Shards for a day of ``rows`` transactions: about ``shard_rows`` rows each."""
    return max(1, math.ceil(rows / shard_rows)) if shard_rows else 1


def _crc_table() -> np.ndarray:
    """zlib's CRC-32 table (reflected polynomial 0xEDB88320), one entry per byte value."""
    crc = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        crc = np.where(crc & 1, (crc >> 1) ^ np.uint32(0xEDB88320), crc >> 1).astype(np.uint32)
    return crc


_CRC_TABLE = _crc_table()


def crc32_strings(values: pa.Array) -> np.ndarray:
    """``zlib.crc32`` of each string's UTF-8 bytes, computed for all strings at once (a byte
    position at a time over the strings that long) rather than one Python call per string;
    null strings hash to 0. Returns uint32."""
    values = values.cast(pa.large_string())
    n = len(values)
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64)[values.offset : values.offset + n + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    if n and not values.null_count and lengths.min() == lengths.max():
        return _crc32_equal_lengths(data[offsets[0] : offsets[-1]].reshape(n, int(lengths[0])))
    # Longest first, so the strings still being hashed at each byte are a prefix.
    order = np.argsort(-lengths, kind="stable")
    starts, lengths = starts[order], lengths[order]
    crc = np.full(n, 0xFFFFFFFF, np.uint32)
    live = n
    for j in range(int(lengths[0]) if n else 0):
        live = int(np.searchsorted(-lengths, -j, side="left"))  # strings longer than j
        byte = data[starts[:live] + j]
        crc[:live] = _CRC_TABLE[(crc[:live] ^ byte) & 0xFF] ^ (crc[:live] >> 8)
    out = np.empty(n, np.uint32)
    out[order] = crc ^ np.uint32(0xFFFFFFFF)
    if values.null_count:
        out[values.is_null().to_numpy(zero_copy_only=False)] = 0
    return out


def _crc32_equal_lengths(strings: np.ndarray) -> np.ndarray:
    """``zlib.crc32`` of each row of an (n, length) uint8 matrix: ids of one width (the usual
    case) need neither the sort by length nor a gather per byte position."""
    crc = np.full(len(strings), 0xFFFFFFFF, np.uint32)
    for j in range(strings.shape[1]):
        crc = _CRC_TABLE[(crc ^ strings[:, j]) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def account_shards(accounts: pa.Array | pa.ChunkedArray, shards: int) -> np.ndarray:
    """Each row's shard: crc32 of its account id modulo ``shards`` (null ids go to shard 0)."""
    if isinstance(accounts, pa.ChunkedArray):
        accounts = accounts.combine_chunks()
    if not accounts.null_count and len(accounts):
        widths = pc.min_max(pc.binary_length(accounts)).as_py()
        if widths["min"] == widths["max"]:
            # One width: hashing every row costs less than finding the distinct ids first.
            return crc32_strings(accounts).astype(np.int64) % shards
    encoded = pc.dictionary_encode(accounts)
    hashes = crc32_strings(encoded.dictionary).astype(np.int64) % shards
    codes = encoded.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    shard = hashes[codes] if len(hashes) else np.zeros(len(accounts), np.int64)
    if accounts.null_count:
        shard[accounts.is_null().to_numpy(zero_copy_only=False)] = 0
    return shard


@dataclass(frozen=True)
class DayFigures:
    """The day-wide figures a shard's profile needs, summed over the day's clean rows."""

    rows: int
    countries: pa.Array
    country_counts: np.ndarray
    merchants: pa.Array
    merchant_reach: np.ndarray

    def complete(self, profile: PartitionProfile) -> PartitionProfile:
        """A shard's profile with the day's country counts, row count and merchant reach."""
        countries = pc.index_in(profile.countries, value_set=self.countries).to_numpy(
            zero_copy_only=False
        )
        merchants = pc.index_in(profile.merchants, value_set=self.merchants).to_numpy(
            zero_copy_only=False
        )
        return replace(
            profile,
            rows=self.rows,
            country_counts=self.country_counts[countries.astype(np.int64)],
            merchant_reach=self.merchant_reach[merchants.astype(np.int64)],
        )


@dataclass
class DayWide:
    """The day-wide figures, filled in when the day is written into shard files (once the
    step holds the partition's lease), before any shard is scored."""

    figures: DayFigures | None = None


class AccountShards:
    """A day's rows written into one file per shard of accounts, in a temporary folder."""

    def __init__(self, shards: int, plan: QuarantinePlan, day_wide: DayWide | None = None):
        self.shards, self.plan = shards, plan
        self.day_wide = day_wide if day_wide is not None else DayWide()
        self._folder = tempfile.TemporaryDirectory(prefix="nightshift-account-shards-")
        self.folder = Path(self._folder.name)
        self.schema: pa.Schema | None = None
        # A day of one shard is that shard whole, which is held to be scored anyway: it stays
        # in memory rather than going through a scratch file.
        self._in_memory: list[pa.Table] | None = [] if shards == 1 else None

    def path(self, shard: int) -> Path:
        return self.folder / f"shard-{shard:05d}.arrow"

    def write(self, batches: Iterable[pa.RecordBatch]) -> DayFigures:
        """Writes every row (quarantined ones too, they are set aside with their shard) into
        its shard's file, with its input position; returns the day-wide figures.

        Each shard's rows are buffered up to its share of :data:`BUFFER_ROWS` and written as
        one row group: a day of many shards neither holds the day nor writes a row group per
        shard per input batch. Three stages overlap, each on its own thread: reading input
        batches, routing them (their rows' shards and the day's country counts), and writing
        each routed batch's rows here."""
        writers: dict[int, ipc.RecordBatchFileWriter] = {}
        pending: dict[int, list[pa.Table]] = {}
        buffered: Counter = Counter()
        flush_at = max(MIN_ROW_GROUP, BUFFER_ROWS // self.shards)
        countries: Counter = Counter()

        def flush(k: int) -> None:
            part = pa.concat_tables(pending.pop(k))
            buffered.pop(k)
            if self._in_memory is not None:
                self._in_memory.append(part)
                return
            if k not in writers:
                writers[k] = ipc.new_file(self.path(k), part.schema, options=SCRATCH_FORMAT)
            writers[k].write_table(part)

        read = Prefetcher(batches, depth=2)
        routed = iter(Prefetcher(self._routed(read, countries), depth=2))
        try:
            with closing(routed):
                for table, order, bounds in routed:
                    for k in map(int, np.flatnonzero(np.diff(bounds))):
                        pending.setdefault(k, []).append(
                            table.take(pa.array(order[bounds[k] : bounds[k + 1]]))
                        )
                        buffered[k] += int(bounds[k + 1] - bounds[k])
                        if buffered[k] >= flush_at:
                            flush(k)
            for k in list(pending):
                flush(k)
        finally:
            for writer in writers.values():
                writer.close()
        names = sorted(countries)
        reach = self._merchant_reach()
        self.day_wide.figures = DayFigures(
            rows=self.plan.rows - self.plan.count,
            countries=pa.array(names, pa.string()),
            country_counts=np.array([countries[n] for n in names], np.int64),
            merchants=reach["merchant_id"].combine_chunks(),
            merchant_reach=reach["n_sum"].to_numpy().astype(np.int64),
        )
        return self.day_wide.figures

    def _routed(
        self, batches: Iterable[pa.RecordBatch], countries: Counter
    ) -> Iterator[tuple[pa.Table, np.ndarray, np.ndarray]]:
        """Each input batch with its positions, its rows in shard order and each shard's
        bounds in that order; the clean rows' countries are counted into ``countries``."""
        offset = 0
        for batch in batches:
            if self.schema is None:
                self.schema = batch.schema.append(pa.field(POSITION, pa.int64()))
            positions = np.arange(offset, offset + batch.num_rows, dtype=np.int64)
            offset += batch.num_rows
            clean = self.plan.split(batch, int(positions[0]))[0] if batch.num_rows else batch
            for value in pc.value_counts(clean["country"]).to_pylist():
                countries[value["values"]] += value["counts"]
            table = pa.Table.from_batches([batch]).append_column(POSITION, pa.array(positions))
            shard = account_shards(batch["account_id"], self.shards)
            order = np.argsort(shard, kind="stable")
            yield table, order, np.searchsorted(shard[order], np.arange(self.shards + 1))

    def _merchant_reach(self) -> pa.Table:
        """Distinct accounts per merchant over clean rows, shard by shard (accounts never span
        two shards, so the per-shard counts add up to the day's), sorted by merchant id."""
        parts = [
            pa.table({"merchant_id": pa.array([], pa.string()), "n": pa.array([], pa.int64())})
        ]
        for shard in range(self.shards):
            rows = self._stored(shard, ["account_id", "merchant_id", POSITION])
            if rows is None:
                continue
            rows = self.plan.split_at(rows, rows[POSITION].to_numpy())[0]
            pairs = rows.group_by(["merchant_id", "account_id"]).aggregate([])
            counts = pc.value_counts(pairs["merchant_id"])
            parts.append(
                pa.table({"merchant_id": counts.field("values"), "n": counts.field("counts")})
            )
        reach = pa.concat_tables(parts).group_by("merchant_id").aggregate([("n", "sum")])
        return reach.take(pc.sort_indices(reach["merchant_id"]))

    def _stored(self, shard: int, columns: list[str] | None = None) -> pa.Table | None:
        """A shard's rows as written (only ``columns``, when given), None if no row hashed to it."""
        if self._in_memory is not None:
            table = pa.concat_tables(self._in_memory) if self._in_memory else None
            return table.select(columns) if table is not None and columns else table
        if not self.path(shard).exists():
            return None
        return _read(self.path(shard), columns)

    def inputs(self) -> Iterator[ShardInput]:
        """Each shard's rows in input order, read back one shard at a time (a shard no account
        hashed to is an empty one: every shard index up to ``shards`` is published)."""
        for shard in range(self.shards):
            table = self._stored(shard)
            # One chunk: the profile and the model calls then see large batches, not one per
            # buffered write.
            table = table.combine_chunks() if table is not None else self.schema.empty_table()
            yield ShardInput(shard, table.drop_columns([POSITION]), table[POSITION].to_numpy())

    def close(self) -> None:
        self._in_memory = [] if self._in_memory is not None else None
        self._folder.cleanup()


def _read(path: Path, columns: list[str] | None = None) -> pa.Table:
    """A scratch file's rows; with ``columns``, only those are decompressed."""
    options = None
    if columns is not None:
        with ipc.open_file(path) as reader:
            names = reader.schema.names
        options = ipc.IpcReadOptions(included_fields=[names.index(c) for c in columns])
    with ipc.open_file(path, options=options) as reader:
        return reader.read_all()


def shard_profile(rows: pa.Table, figures: DayFigures) -> PartitionProfile:
    """The profile of one shard's clean rows, completed with the day-wide figures."""
    builder = ProfileBuilder(rows.num_rows)
    for batch in rows.select(PROFILE_COLUMNS).to_batches():
        builder.add(batch)
    return figures.complete(builder.finish())


def account_cut(plan: QuarantinePlan, shard_rows: int) -> ShardCut:
    """A day cut into shards of whole accounts, about ``shard_rows`` rows each; its context is
    the day-wide figures, filled in as the day is written into shard files, which each shard's
    profile is completed with (:func:`shard_profile`)."""
    count = shard_count(plan.rows - plan.count, shard_rows)
    day_wide = DayWide()

    def inputs(rows: Iterable[pa.RecordBatch]) -> Iterator[ShardInput]:
        cut = AccountShards(count, plan, day_wide)
        try:
            cut.write(rows)
            yield from cut.inputs()
        finally:
            cut.close()

    return ShardCut(inputs, {"shard_layout": "account_hash", "account_shards": count}, day_wide)


def day_profile(rows: pa.Table, day_wide: DayWide) -> PartitionProfile:
    """The profile of one shard of :func:`account_cut`, once the day has been cut."""
    if day_wide.figures is None:
        raise RuntimeError("a shard of accounts was scored before the day was cut")
    return shard_profile(rows, day_wide.figures)
