"""Published output partitions: the checkpointed writer's target for each, a whole partition
written and committed in one step, and the committed files read back."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from inference.engine.leases import CasStore, LocalCasStore, S3CasStore
from inference.engine.output_partition import MANIFEST, PartitionTarget
from inference.engine.shard_writer import ShardedWriter, ShardFileTargets
from resources.filestore import FileStore


@dataclass(frozen=True)
class Published:
    """Where a partition was published and how many rows it holds."""

    uri: str
    rows: int
    files: int


class OutputStore(FileStore):
    """Writes and reads the output partitions under a data root (``outputs/<asset>/date=D/``)."""

    def partition_target(self, asset: str, date: str) -> PartitionTarget:
        """The output partition's final folder, staging area, trash and lease."""
        asset_dir = self.path("outputs", asset)
        return PartitionTarget(
            fs=self.fs,
            final_dir=self.output_path(asset, date),
            staging_dir=f"{asset_dir}/_staging/date={date}",
            trash_dir=f"{asset_dir}/_trash/date={date}",
            lease_path=f"{asset_dir}/_leases/date={date}.json",
            cas=self.cas(),
            uri_prefix=self._scheme,
        )

    def cas(self) -> CasStore:
        """Compare-and-swap on this store's objects: what leases and alias moves hold."""
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
            ShardFileTargets(self.partition_target(asset, date), schema),
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
