"""Partitioned data storage on a local folder or S3, behind one interface.

Layout (Hive-style, readable by pyarrow, Spark, DuckDB, Athena):
``<root>/landing/<dataset>/date=YYYY-MM-DD/*.parquet`` for inputs and
``<root>/outputs/<asset>/date=YYYY-MM-DD/`` for published outputs.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from dagster import ConfigurableResource
from pydantic import Field

from inference.leases import CasStore, LocalCasStore, S3CasStore
from inference.shards import MANIFEST, PartitionTarget, ShardedWriter
from inference.streaming import iter_parquet


class LandingDataError(ValueError):
    """Landing data is missing or does not match the schema the pipeline needs."""


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
    """

    def __init__(self, root: str, s3_endpoint: str | None = None, s3_region: str | None = None):
        self.root = root
        self.s3_endpoint, self.s3_region = s3_endpoint, s3_region
        self.fs, self.base, self._scheme = open_filesystem(root, s3_endpoint, s3_region)

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

    def _parquet_files(self, path: str) -> list[str]:
        info = self.fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            return []
        selector = pafs.FileSelector(path, recursive=True)
        return sorted(
            f.path
            for f in self.fs.get_file_info(selector)
            if f.type == pafs.FileType.File and f.path.endswith(".parquet")
        )

    # -- landing -------------------------------------------------------------------------
    def landing_files(self, dataset: str, date: str) -> list[str]:
        """The partition's parquet files; raises LandingDataError if there are none."""
        path = self.landing_path(dataset, date)
        files = self._parquet_files(path)
        if not files:
            raise LandingDataError(
                f"landing partition missing: dataset '{dataset}', date {date}: "
                f"no parquet files under {self.uri(path)}"
            )
        return files

    def landing_dataset(self, dataset: str, date: str, required: pa.Schema) -> ds.Dataset:
        """Opens a landing partition after checking every file has the required columns.

        Each file's schema is checked on its own, so an error names the file and column.
        Integer widths may differ (int32 where int64 is required); other types must match.
        """
        files = self.landing_files(dataset, date)
        for file in files:
            try:
                schema = pq.read_schema(file, filesystem=self.fs)
            except (pa.ArrowInvalid, OSError) as exc:
                raise LandingDataError(
                    f"unreadable parquet file {self.uri(file)} in dataset '{dataset}', "
                    f"date {date}: {exc}"
                ) from exc
            check_schema(
                schema, required, where=f"{self.uri(file)} (dataset '{dataset}', date {date})"
            )
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
        column and byte range where decoding failed.
        """
        for _, batch in self.iter_landing_files(dataset, date, required, columns, batch_size):
            yield batch

    def iter_landing_files(
        self,
        dataset: str,
        date: str,
        required: pa.Schema,
        columns: list[str] | None = None,
        batch_size: int = 65_536,
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Like :meth:`iter_landing`, with the file each batch comes from (for error messages)."""
        wanted = columns or required.names
        for file in self.landing_dataset(dataset, date, required).files:
            # A pull-based reader: one row group in memory at a time, whatever the file's size
            # (a dataset scanner reads ahead while the model is busy; see inference/streaming).
            batches = iter_parquet(
                file, columns=wanted, batch_size=batch_size, schema=required, filesystem=self.fs
            )
            try:
                for batch in batches:
                    yield file, batch.select(wanted)
            except (pa.ArrowInvalid, OSError) as exc:
                where = _locate_damage(self.fs, file, columns or required.names)
                raise LandingDataError(
                    f"unreadable parquet file {self.uri(file)} in dataset '{dataset}', "
                    f"date {date}{where}: {exc}"
                ) from exc

    def read_landing(
        self, dataset: str, date: str, required: pa.Schema, columns: list[str] | None = None
    ) -> pa.Table:
        return self.landing_dataset(dataset, date, required).to_table(columns=columns)

    def count_landing(self, dataset: str, date: str, required: pa.Schema) -> int:
        return self.landing_dataset(dataset, date, required).count_rows()

    def write_landing(self, dataset: str, date: str, table: pa.Table) -> str:
        """Replaces a landing partition with one file (used by the demo-data generator)."""
        path = self.landing_path(dataset, date)
        self._delete_dir(path)
        self.fs.create_dir(path, recursive=True)
        file = f"{path}/part-00000.parquet"
        pq.write_table(table, file, filesystem=self.fs)
        return self.uri(file)

    def landing_dates(self, dataset: str) -> list[str]:
        """Dates that have a landing partition for the dataset, oldest first."""
        path = self.path("landing", dataset)
        if not self.exists(path):
            return []
        entries = self.fs.get_file_info(pafs.FileSelector(path))
        return sorted(
            e.base_name[len("date=") :]
            for e in entries
            if e.type == pafs.FileType.Directory and e.base_name.startswith("date=")
        )

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


def check_schema(actual: pa.Schema, required: pa.Schema, where: str) -> None:
    """Raises LandingDataError naming the file and column that does not fit the contract."""
    for field in required:
        index = actual.get_field_index(field.name)
        if index < 0:
            raise LandingDataError(
                f"{where}: required column '{field.name}' ({field.type}) is missing; "
                f"found columns {actual.names}"
            )
        found = actual.field(index).type
        if not _compatible(found, field.type):
            raise LandingDataError(
                f"{where}: column '{field.name}' has type {found}, expected {field.type}"
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

    def store(self) -> DataStore:
        return DataStore(self.data_root or default_data_root(), self.s3_endpoint, self.s3_region)
