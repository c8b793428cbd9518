"""Partitioned data storage on a local folder or S3, behind one interface.

Layout (Hive-style, readable by pyarrow, Spark, DuckDB, Athena):
``<root>/landing/<dataset>/date=YYYY-MM-DD/*.parquet`` for inputs and
``<root>/outputs/<asset>/date=YYYY-MM-DD/`` for published outputs. As in Hive and Spark, a file
or folder whose name starts with ``_`` or ``.`` is not data (``_SUCCESS``, ``_temporary/`` of
an unfinished write, ``.crc`` checksums, ``_committed_*``): it is never read as input.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from dagster import ConfigurableResource
from pydantic import Field, PrivateAttr

from inference.batching import coalesce
from inference.diskspace import writing
from inference.leases import CasStore, LocalCasStore, S3CasStore
from inference.shards import MANIFEST, PartitionTarget, ShardedWriter
from inference.streaming import READ_AHEAD_THREADS, THREADED_ROWS, iter_parquet_files
from inference.timestamps import LandingTimezones, NonexistentTimeError, is_naive_for


class LandingDataError(ValueError):
    """Landing data is missing or does not match the schema the pipeline needs."""


@dataclass(frozen=True)
class Listing:
    """A partition folder's parquet data files, and the files under it that are not data."""

    files: list[pafs.FileInfo] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]


def is_data(relative: str) -> bool:
    """Whether a path below a partition folder is data: no part of it starts with ``_`` or ``.``
    (the Hive/Spark convention for commit markers, unfinished writes and checksums)."""
    return not (relative.startswith(("_", ".")) or "/_" in relative or "/." in relative)


# Footers and small files fetched at once from an object store, where each read is a round
# trip; a local disk reads footers faster on the calling thread (500 footers: 0.03-0.05 s in
# turn, 0.03-0.10 s on pools of 2-8 here).
REMOTE_READ_THREADS = 16
# A parquet footer takes ~17 KiB in memory (8 columns, one row group): a store keeps those of
# partitions up to this many files (~34 MiB), so their readers need not read them again; in a
# larger partition each reader reads its own, and they are checked a chunk at a time.
FOOTERS_KEPT = 2_048
FOOTER_CHUNK = 256
# A partition made only of small files (each under THREADED_ROWS rows) is kept decoded for the
# next pass over it while it takes at most this much memory: a 100k-row day of transactions is
# about 10 MB. 500 files of 200 rows cost ~0.1 s of fixed per-file work on every pass.
SMALL_FILES_CACHE_BYTES = 64 << 20
# Files whose contract check a store remembers (a row count each, a few hundred bytes).
CHECKED_KEPT = 200_000


@dataclass(frozen=True)
class Published:
    """Where a partition was published and how many rows it holds."""

    uri: str
    rows: int
    files: int


def open_filesystem(
    root: str, s3_endpoint: str | None = None, s3_region: str | None = None
) -> tuple[pafs.FileSystem, str, str]:
    """Resolves a data root to (filesystem, base path, display prefix)."""
    if root.startswith("s3://"):
        kwargs: dict = {}
        if s3_region:
            kwargs["region"] = s3_region
        if s3_endpoint:
            scheme, _, host = s3_endpoint.rpartition("://")
            kwargs["endpoint_override"] = host or s3_endpoint
            kwargs["scheme"] = scheme or "https"
        return pafs.S3FileSystem(**kwargs), root[len("s3://") :].rstrip("/"), "s3://"
    local = pafs.LocalFileSystem()
    base = os.path.abspath(root)
    local.create_dir(base, recursive=True)
    return local, base, ""


class DataStore:
    """Reads landing partitions and publishes output partitions under one data root.

    Args:
        root: a local folder or ``s3://bucket/prefix``.
        s3_endpoint: endpoint override for S3-compatible servers (``http://127.0.0.1:9000``).
        s3_region: S3 region.
        landing_timezone: whose wall-clock time landing timestamps without a time zone are:
            ``America/New_York`` (every dataset), ``transactions=America/New_York`` (one), or
            both, comma-separated; None rejects them (see inference/timestamps).
    """

    def __init__(
        self,
        root: str,
        s3_endpoint: str | None = None,
        s3_region: str | None = None,
        landing_timezone: str | None = None,
    ):
        self.root = root
        self.s3_endpoint, self.s3_region = s3_endpoint, s3_region
        self.landing_timezones = LandingTimezones.parse(landing_timezone)
        self.fs, self.base, self._scheme = open_filesystem(root, s3_endpoint, s3_region)
        # By (path, size, mtime), so a changed file is read afresh: the rows of files whose schema
        # passed a contract, and their footers (see FOOTERS_KEPT). A step lists, counts, screens
        # and scores the same files several times; their footers are read once.
        self._checked: dict[tuple, int] = {}
        self._footer_cache: dict[tuple, pq.FileMetaData] = {}
        # The decoded rows of the last partition of small files read whole (see
        # iter_landing_files), keyed on its files' identities, the contract and time zone.
        self._small_files: dict[tuple, list[tuple[str, list[pa.RecordBatch]]]] = {}

    # -- paths ---------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join([self.base, *parts])

    def uri(self, path: str) -> str:
        return f"{self._scheme}{path}"

    @property
    def models_dir(self) -> str:
        return self.path("models")

    def landing_path(self, dataset: str, date: str) -> str:
        return self.path("landing", dataset, f"date={date}")

    def output_path(self, asset: str, date: str) -> str:
        return self.path("outputs", asset, f"date={date}")

    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def _listing(self, path: str) -> Listing:
        info = self.fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            return Listing()
        files, skipped, start = [], [], len(path) + 1
        for f in self.fs.get_file_info(pafs.FileSelector(path, recursive=True)):
            if f.type != pafs.FileType.File:
                continue
            name = f.path
            if not is_data(name[start:]):
                skipped.append(name)
            elif name.endswith(".parquet"):
                files.append((name, f))
        files.sort(key=lambda entry: entry[0])
        return Listing([f for _, f in files], sorted(skipped))

    def _parquet_files(self, path: str) -> list[str]:
        return self._listing(path).paths

    # -- landing -------------------------------------------------------------------------
    def landing_listing(self, dataset: str, date: str) -> Listing:
        """The partition's data files, and the not-data files below it that are skipped."""
        return self._listing(self.landing_path(dataset, date))

    def landing_files(self, dataset: str, date: str) -> list[str]:
        """The partition's parquet files; raises LandingDataError if there are none."""
        return [f.path for f in self._landing_infos(dataset, date)]

    def landing_fingerprint(self, dataset: str, date: str) -> str | None:
        """A short hash of the partition's data files (path, size, modification time), or None
        when it has none yet: any file added, replaced, rewritten or removed changes it."""
        path = self.landing_path(dataset, date)
        files = self.landing_listing(dataset, date).files
        if not files:
            return None
        digest = hashlib.sha256()
        for f in files:
            digest.update(f"{f.path[len(path) :]}\t{f.size}\t{f.mtime_ns}\n".encode())
        return digest.hexdigest()[:16]

    def _landing_infos(self, dataset: str, date: str) -> list[pafs.FileInfo]:
        path = self.landing_path(dataset, date)
        listing = self._listing(path)
        if not listing.files:
            n = len(listing.skipped)
            skipped = f" ({n} not-data file(s) skipped)" if n else ""
            raise LandingDataError(
                f"landing partition missing: dataset '{dataset}', date {date}: "
                f"no parquet files under {self.uri(path)}{skipped}"
            )
        return listing.files

    def _read_footers(self, files: list[str]) -> list[pq.FileMetaData | Exception]:
        def read(file: str) -> pq.FileMetaData | Exception:
            try:
                return pq.read_metadata(file, filesystem=self.fs)
            except (pa.ArrowInvalid, OSError) as exc:
                return exc

        if len(files) > 1 and not isinstance(self.fs, pafs.LocalFileSystem):
            with ThreadPoolExecutor(min(REMOTE_READ_THREADS, len(files))) as pool:
                return list(pool.map(read, files))
        return [read(f) for f in files]

    def _checked_landing(
        self, dataset: str, date: str, required: pa.Schema
    ) -> list[tuple[str, int, pq.FileMetaData | None]]:
        """The partition's files with their rows (and footers when kept), each file's schema
        checked against the contract, the first bad file in order named."""
        return self._checked_landing_keyed(dataset, date, required)[1]

    def _checked_landing_keyed(
        self, dataset: str, date: str, required: pa.Schema
    ) -> tuple[tuple, list[tuple[str, int, pq.FileMetaData | None]]]:
        """:meth:`_checked_landing`, with a key naming exactly these files (path, size, mtime)
        under this contract and time zone."""
        files = self._landing_infos(dataset, date)
        timezone = self.landing_timezone(dataset)
        contract = (hash(required), timezone)
        keys = [(f.path, f.size, f.mtime_ns or f.mtime) for f in files]
        keep = len(files) <= FOOTERS_KEPT
        rows = [self._checked.get((key, contract)) for key in keys]
        footers = [self._footer_cache.get(key) if keep else None for key in keys]
        todo = [i for i in range(len(keys)) if rows[i] is None or (keep and footers[i] is None)]
        if keep and len(self._footer_cache) + len(todo) > FOOTERS_KEPT:
            self._footer_cache.clear()  # a long-lived store forgets older days' footers
        if len(self._checked) + len(todo) > CHECKED_KEPT:
            self._checked.clear()
        for start in range(0, len(todo), FOOTER_CHUNK):  # a chunk of footers in memory at once
            chunk = todo[start : start + FOOTER_CHUNK]
            read = self._read_footers([keys[i][0] for i in chunk])
            for i, footer in zip(chunk, read, strict=True):
                where = f"{self.uri(keys[i][0])} (dataset '{dataset}', date {date})"
                if isinstance(footer, Exception):
                    raise LandingDataError(
                        f"unreadable parquet file {self.uri(keys[i][0])} in dataset "
                        f"'{dataset}', date {date}: {footer}"
                    ) from footer
                check_schema(footer.schema.to_arrow_schema(), required, where, timezone=timezone)
                rows[i] = self._checked[(keys[i], contract)] = footer.num_rows
                if keep:
                    footers[i] = self._footer_cache[keys[i]] = footer
        checked = [(key[0], n, footer) for key, n, footer in zip(keys, rows, footers, strict=True)]
        return (dataset, date, tuple(keys), contract), checked

    def landing_dataset(self, dataset: str, date: str, required: pa.Schema) -> ds.Dataset:
        """Opens a landing partition after checking every file has the required columns.

        Each file's schema is checked on its own, so an error names the file and column.
        Integer widths may differ (int32 where int64 is required); other types must match.
        """
        files = [f for f, _, _ in self._checked_landing(dataset, date, required)]
        return ds.dataset(files, schema=required, filesystem=self.fs, format="parquet")

    def iter_landing(
        self,
        dataset: str,
        date: str,
        required: pa.Schema,
        columns: list[str] | None = None,
        batch_size: int = 65_536,
    ) -> Iterator[pa.RecordBatch]:
        """Streams a landing partition as record batches cast to the required schema.

        Files are read one at a time, in order, so a file whose data cannot be decoded (a
        corrupt page, a truncated column chunk) fails naming the file, and the row group,
        column and byte range where decoding failed. Batches of small files are joined up to
        ``batch_size`` rows: a day landed as 500 files of 200 rows reaches the model and the
        screening rules in two batches, not 500, each costing its own per-call overhead.
        """
        batches = self.iter_landing_files(dataset, date, required, columns, batch_size)
        yield from coalesce((batch for _, batch in batches), batch_size)

    def iter_landing_files(
        self,
        dataset: str,
        date: str,
        required: pa.Schema,
        columns: list[str] | None = None,
        batch_size: int = 65_536,
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Like :meth:`iter_landing`, with the file each batch comes from (for error messages);
        batches are not joined across files."""
        wanted = columns or required.names
        key, checked = self._checked_landing_keyed(dataset, date, required)
        # A partition of small files only, read before by this store with exactly these files:
        # its decoded rows are served again instead of paying each file's fixed cost once more
        # (a fraud run reads the day three times: screening, the feature profile, scoring).
        cached = self._small_files.get(key)
        if cached is not None:
            for file, batches in cached:
                for batch in batches:
                    yield file, batch.select(wanted)
            return
        cacheable = all(rows < THREADED_ROWS for _, rows, _ in checked)
        if cacheable:
            self._small_files.clear()  # one partition at a time: a backfill moves on
            wanted_here, keep, kept_bytes = list(required.names), [], 0
        else:
            wanted_here = wanted
        remote = not isinstance(self.fs, pafs.LocalFileSystem)
        # Pull-based readers: one row group of a large file in memory at a time (a dataset
        # scanner reads ahead while the model is busy; see inference/streaming), small files
        # read whole a batch's worth ahead, on more threads where each read is a round trip.
        files = iter_parquet_files(
            [f for f, _, _ in checked],
            [rows for _, rows, _ in checked],
            footers=[footer for _, _, footer in checked],
            columns=wanted_here,
            batch_size=batch_size,
            schema=required,
            filesystem=self.fs,
            timezone=self.landing_timezone(dataset),
            threads=REMOTE_READ_THREADS if remote else READ_AHEAD_THREADS,
            pre_buffer=remote,
        )
        for file, batches in files:
            try:
                read = []
                for batch in batches:
                    if cacheable:
                        read.append(batch)
                    yield file, batch.select(wanted)
                if cacheable:
                    kept_bytes += sum(b.nbytes for b in read)
                    cacheable = kept_bytes <= SMALL_FILES_CACHE_BYTES
                    keep.append((file, read))
            except NonexistentTimeError as exc:
                raise LandingDataError(
                    f"{self.uri(file)} (dataset '{dataset}', date {date}): {exc}"
                ) from exc
            except (pa.ArrowInvalid, OSError) as exc:
                where = _locate_damage(self.fs, file, columns or required.names)
                raise LandingDataError(
                    f"unreadable parquet file {self.uri(file)} in dataset '{dataset}', "
                    f"date {date}{where}: {exc}"
                ) from exc
        if cacheable:  # read to the end, within the budget: the next pass is served from it
            self._small_files[key] = keep

    def read_landing(
        self, dataset: str, date: str, required: pa.Schema, columns: list[str] | None = None
    ) -> pa.Table:
        # Through the same reader as scoring, so naive timestamps get the landing timezone.
        batches = list(self.iter_landing_files(dataset, date, required, columns))
        schema = pa.schema([required.field(name) for name in columns or required.names])
        return pa.Table.from_batches([b for _, b in batches], schema=schema)

    def landing_timezone(self, dataset: str) -> str | None:
        """The zone whose wall-clock time the dataset's naive timestamps are; None rejects them."""
        return self.landing_timezones.for_dataset(dataset)

    def count_landing(self, dataset: str, date: str, required: pa.Schema) -> int:
        """Rows in a landing partition, from its files' footers (no data is read)."""
        return sum(rows for _, rows, _ in self._checked_landing(dataset, date, required))

    def write_landing(self, dataset: str, date: str, table: pa.Table) -> str:
        """Replaces a landing partition with one file (used by the demo-data generator)."""
        path = self.landing_path(dataset, date)
        self._delete_dir(path)
        self.fs.create_dir(path, recursive=True)
        file = f"{path}/part-00000.parquet"
        pq.write_table(table, file, filesystem=self.fs)
        return self.uri(file)

    def landing_dates(self, dataset: str) -> list[str]:
        """Dates that have a landing partition with data for the dataset, oldest first.

        A date folder holding only files that are not data (a Spark write still under
        ``_temporary/``) is not a partition yet.
        """
        path = self.path("landing", dataset)
        if not self.exists(path):
            return []
        dates = set()
        for entry in self.fs.get_file_info(pafs.FileSelector(path, recursive=True)):
            folder, _, rest = entry.path[len(path) :].lstrip("/").partition("/")
            if (
                entry.type == pafs.FileType.File
                and folder.startswith("date=")
                and rest.endswith(".parquet")
                and is_data(rest)
            ):
                dates.add(folder[len("date=") :])
        return sorted(dates)

    # -- outputs -------------------------------------------------------------------------
    def partition_target(self, asset: str, date: str) -> PartitionTarget:
        """The output partition's final folder, staging area, trash and lease."""
        asset_dir = self.path("outputs", asset)
        return PartitionTarget(
            fs=self.fs,
            final_dir=self.output_path(asset, date),
            staging_dir=f"{asset_dir}/_staging/date={date}",
            trash_dir=f"{asset_dir}/_trash/date={date}",
            lease_path=f"{asset_dir}/_leases/date={date}.json",
            cas=self._cas(),
            uri_prefix=self._scheme,
        )

    def _cas(self) -> CasStore:
        if isinstance(self.fs, pafs.LocalFileSystem):
            return LocalCasStore()
        # dagster-aws's S3Resource builds the client (credentials, endpoint override, retries);
        # pyarrow's S3 filesystem moves the data, this client takes the conditional writes.
        from dagster_aws.s3 import S3Resource

        client = S3Resource(region_name=self.s3_region, endpoint_url=self.s3_endpoint).get_client()
        return S3CasStore(client)

    def publish(
        self, asset: str, date: str, batches: Iterable[pa.RecordBatch | pa.Table], schema: pa.Schema
    ) -> Published:
        """Writes a whole partition and commits it in one step (no checkpoints).

        Re-running a partition replaces it; it never appends. If writing fails, nothing is
        committed and the previously published partition stays as it was.
        """
        writer = ShardedWriter(
            self.partition_target(asset, date),
            schema,
            uuid.uuid4().hex,
            shard_rows=0,
            lineage=f"publish-{uuid.uuid4().hex}",
        )
        writer.begin()
        try:
            tables = (b if isinstance(b, pa.Table) else pa.Table.from_batches([b]) for b in batches)
            writer.write_shard(0, tables, rows_in=0)
            report = writer.commit(1)
        finally:
            writer.close()
            writer.discard_staging()
        return Published(uri=report.uri, rows=report.rows_out, files=1)

    def output_files(self, asset: str, date: str) -> list[str]:
        """The committed partition's files: those its manifest lists, when it has one."""
        path = self.output_path(asset, date)
        try:
            manifest = json.loads(self.read_bytes(f"{path}/{MANIFEST}"))
        except (FileNotFoundError, OSError):
            return self._parquet_files(path)
        return [f"{path}/{name}" for name in manifest["files"]]

    def output_commit(self, asset: str, date: str) -> str | None:
        """The commit id in a published partition's manifest; None without one."""
        try:
            manifest = json.loads(self.read_bytes(f"{self.output_path(asset, date)}/{MANIFEST}"))
        except (FileNotFoundError, OSError):
            return None
        return manifest.get("commit")

    def read_output(self, asset: str, date: str) -> pa.Table:
        path = self.output_path(asset, date)
        files = self.output_files(asset, date)
        if not files:
            raise FileNotFoundError(
                f"no published output for '{asset}', date {date} at {self.uri(path)}"
            )
        return ds.dataset(files, filesystem=self.fs, format="parquet").to_table()

    def output_exists(self, asset: str, date: str) -> bool:
        return bool(self.output_files(asset, date))

    # -- raw objects (models, manifests) -------------------------------------------------
    def write_bytes(self, path: str, data: bytes) -> None:
        parent = path.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"

        def cleanup() -> None:
            if self.exists(tmp):
                self.fs.delete_file(tmp)

        with writing(path, self.uri(path), cleanup, local=not self._scheme):
            with self.fs.open_output_stream(tmp) as out:
                out.write(data)
        self.fs.move(tmp, path)

    def read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as stream:
            return stream.read()

    def _delete_dir(self, path: str) -> None:
        if self.exists(path):
            self.fs.delete_dir(path)


def _locate_damage(fs: pafs.FileSystem, file: str, columns: list[str]) -> str:
    """Where a parquet file stops decoding: ", row group R, column 'C', bytes A-B", or ""."""
    try:
        parquet = pq.ParquetFile(file, filesystem=fs)
        meta = parquet.metadata
        names = parquet.schema_arrow.names
        for group in range(meta.num_row_groups):
            for name in [c for c in columns if c in names]:
                try:
                    parquet.read_row_group(group, columns=[name])
                except (pa.ArrowInvalid, OSError):
                    chunk = meta.row_group(group).column(names.index(name))
                    start = chunk.dictionary_page_offset or chunk.data_page_offset
                    end = start + chunk.total_compressed_size
                    return f", row group {group}, column '{name}', bytes {start}-{end}"
    except (pa.ArrowInvalid, OSError):
        return ""
    return ""


def check_schema(
    actual: pa.Schema, required: pa.Schema, where: str, timezone: str | None = None
) -> None:
    """Raises LandingDataError naming the file and column that does not fit the contract.

    A timestamp without a time zone where the contract has one is accepted only with the
    dataset's landing timezone, which says whose wall-clock time it is; else it would be read
    as UTC, and a local evening's rows would land in the next day.
    """
    for want in required:
        index = actual.get_field_index(want.name)
        if index < 0:
            raise LandingDataError(
                f"{where}: required column '{want.name}' ({want.type}) is missing; "
                f"found columns {actual.names}"
            )
        found = actual.field(index).type
        if is_naive_for(found, want.type) and timezone is None:
            raise LandingDataError(
                f"{where}: column '{want.name}' is {found} without a time zone; expected "
                f"{want.type}: write it with a time zone, or set the dataset's landing timezone "
                "(NIGHTSHIFT_LANDING_TIMEZONE or the storage resource's landing_timezone, e.g. "
                "'America/New_York') to read it as wall-clock time there"
            )
        if not _compatible(found, want.type):
            raise LandingDataError(
                f"{where}: column '{want.name}' has type {found}, expected {want.type}"
            )


def _compatible(found: pa.DataType, expected: pa.DataType) -> bool:
    if found == expected:
        return True
    checks = [pa.types.is_integer, pa.types.is_floating, pa.types.is_string, pa.types.is_timestamp]
    for check in checks:
        if check(expected):
            if check is pa.types.is_string:
                return pa.types.is_string(found) or pa.types.is_large_string(found)
            if check is pa.types.is_floating:
                return pa.types.is_floating(found) or pa.types.is_integer(found)
            return check(found)
    return False


REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_ROOT = REPO_ROOT / ".nightshift" / "data"


def default_data_root() -> str:
    """``$NIGHTSHIFT_DATA_ROOT``, else ``.nightshift/data`` inside the repository."""
    return os.environ.get("NIGHTSHIFT_DATA_ROOT") or str(DEFAULT_DATA_ROOT)


class StorageResource(ConfigurableResource):
    """Where nightshift reads landing data and publishes outputs: a folder or an S3 prefix."""

    data_root: str | None = Field(
        default=None,
        description="Local folder or s3://bucket/prefix; default $NIGHTSHIFT_DATA_ROOT or "
        ".nightshift/data in the repository.",
    )
    s3_endpoint: str | None = Field(default=None, description="S3-compatible endpoint override.")
    s3_region: str | None = Field(default=None, description="S3 region.")
    landing_timezone: str | None = Field(
        default=None,
        description="Whose wall-clock time landing timestamps without a time zone are: an IANA "
        "zone for every dataset (America/New_York), per dataset (transactions=America/New_York,"
        "documents=Europe/Paris), or both; unset rejects them.",
    )

    # One store for the resource's life: the steps of a run (one process, in-process executor)
    # then check each landing file's footer once, not once per step.
    _store: DataStore | None = PrivateAttr(default=None)

    def store(self) -> DataStore:
        if self._store is None:
            self._store = DataStore(
                self.data_root or default_data_root(),
                self.s3_endpoint,
                self.s3_region,
                landing_timezone=self.landing_timezone,
            )
        return self._store
