"""The outputs of a data root: one Apache Iceberg table per output asset, partitioned by day
(``inference.engine.tables``), in a catalog chosen by setting, with each table's files under
``<data_root>/outputs/<asset>/`` (``data/date=D/`` and ``metadata/``) beside the staging
areas and leases of its days (``_staging/``, ``_leases/``).

The catalog:

- ``sql`` (the default): a SQL catalog. Its URI defaults to a SQLite file,
  ``<data_root>/catalog/nightshift.db`` for a local data root, so no server is needed; for an
  S3 data root, ``nightshift.db`` in ``$DAGSTER_HOME`` (a SQLite file cannot live on S3): set a
  PostgreSQL URI there (``postgresql+psycopg2://...``) to share it between nodes.
- ``glue``: AWS Glue, in the data root's region (and at its endpoint override, for tests).
- ``rest``: any Iceberg REST catalog, at the catalog URI.

Every read of an output goes through its table at a snapshot: main's by default, or the
snapshot a day was staged at while its checks read it (:meth:`OutputStore.reading`).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from inference.engine.leases import CasStore, LocalCasStore, S3CasStore
from inference.engine.output_partition import PartitionTarget
from inference.engine.shard_writer import ShardedWriter, ShardFileTargets
from inference.engine.tables import (
    NAMESPACE,
    DaySnapshot,
    DayTable,
    OutputTables,
    StagedDay,
    TableError,
)
from resources.filestore import FileStore

CATALOG_ENV, CATALOG_URI_ENV = "NIGHTSHIFT_CATALOG", "NIGHTSHIFT_CATALOG_URI"
NAMESPACE_ENV = "NIGHTSHIFT_CATALOG_NAMESPACE"
CATALOG_KINDS = ("sql", "glue", "rest")


@dataclass(frozen=True)
class Published:
    """Where a partition was published and how many rows it holds."""

    uri: str
    rows: int
    files: int
    # table -> the snapshot that put the day on its main.
    snapshots: dict[str, int] = field(default_factory=dict)
    # Published with ``audit``: the day staged, waiting for its checks (not on main yet).
    staged: StagedDay | None = None


def catalog_properties(
    kind: str | None,
    uri: str | None,
    root: str,
    s3_endpoint: str | None = None,
    s3_region: str | None = None,
) -> dict[str, str]:
    """pyiceberg's properties for the catalog ``kind`` (default ``$NIGHTSHIFT_CATALOG``, else
    ``sql``) at ``uri`` (default ``$NIGHTSHIFT_CATALOG_URI``, else the embedded SQLite file)."""
    kind = (kind or os.environ.get(CATALOG_ENV) or "sql").strip().lower()
    uri = uri or os.environ.get(CATALOG_URI_ENV) or None
    if kind not in CATALOG_KINDS:
        raise ValueError(
            f"catalog '{kind}' (storage resource's catalog or ${CATALOG_ENV}) is not one of "
            f"{', '.join(CATALOG_KINDS)}"
        )
    props: dict[str, str] = {"type": kind}
    if root.startswith("s3://"):
        if s3_endpoint:
            props["s3.endpoint"] = s3_endpoint
        if s3_region:
            props["s3.region"] = s3_region
    if kind != "rest":
        # A REST catalog's warehouse names its server-side catalog (Polaris, Lakekeeper): it
        # is the server's setting, given like its token (PYICEBERG_CATALOG__NIGHTSHIFT__...).
        props["warehouse"] = tables_root(root)
    if kind == "sql":
        props["uri"] = uri or f"sqlite:///{_embedded_catalog(root)}"
    elif kind == "rest":
        if not uri:
            raise ValueError(f"a rest catalog needs its URI: set ${CATALOG_URI_ENV}")
        props["uri"] = uri
    else:
        if s3_region:
            props["glue.region"] = s3_region
        if s3_endpoint:  # moto's Glue beside its S3, in tests
            props["glue.endpoint"] = s3_endpoint
    return props


def tables_root(root: str) -> str:
    """The folder under which new tables get their own, ``<data_root>/outputs``, as a URI."""
    if root.startswith("s3://"):
        return f"{root.rstrip('/')}/outputs"
    return Path(root, "outputs").absolute().as_uri()


def namespace_setting(namespace: str | None) -> str:
    """The tables' namespace: ``namespace``, else ``$NIGHTSHIFT_CATALOG_NAMESPACE``, else
    ``nightshift``; dotted for a nested one (``gold.nightshift``)."""
    chosen = (namespace or os.environ.get(NAMESPACE_ENV) or NAMESPACE).strip()
    if not all(part.strip() for part in chosen.split(".")):
        raise ValueError(
            f"catalog namespace '{chosen}' (storage resource's catalog_namespace or "
            f"${NAMESPACE_ENV}) has an empty level"
        )
    return chosen


def _embedded_catalog(root: str) -> str:
    """The SQLite file of a data root's embedded catalog. An S3 root's cannot live beside its
    data: it is kept in ``$DAGSTER_HOME`` under a name of its own, so two data roots never
    share table names; it serves one machine only (set glue, rest or a PostgreSQL URI for
    nodes that share the root)."""
    if root.startswith("s3://"):
        name = hashlib.sha256(root.rstrip("/").encode()).hexdigest()[:16]
        folder = Path(os.environ.get("DAGSTER_HOME") or ".nightshift", "catalogs")
        file = folder / f"{name}.db"
    else:
        folder = Path(root, "catalog")
        file = folder / "nightshift.db"
    folder.mkdir(parents=True, exist_ok=True)
    return str(file.absolute())


def open_catalog(props: dict[str, str]):
    from pyiceberg.catalog import load_catalog

    # Two processes opening a fresh SQLite catalog at once both create its tables; the loser
    # finds them there on a second try.
    for attempt in range(3):
        try:
            # The name is part of a SQL catalog's keys: every reader and writer uses this one.
            return load_catalog("nightshift", **props)
        except Exception:  # noqa: BLE001 - sqlalchemy's "table already exists" and the like
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


class OutputStore(FileStore):
    """Writes and reads the output tables of a data root.

    Args:
        catalog: ``sql``, ``glue`` or ``rest`` (default ``$NIGHTSHIFT_CATALOG``, else ``sql``).
        catalog_uri: the catalog's URI (default ``$NIGHTSHIFT_CATALOG_URI``, else SQLite).
        catalog_namespace: the tables' namespace (see :func:`namespace_setting`).
    """

    def __init__(
        self,
        root: str,
        s3_endpoint: str | None = None,
        s3_region: str | None = None,
        catalog: str | None = None,
        catalog_uri: str | None = None,
        catalog_namespace: str | None = None,
    ):
        self.catalog_props = catalog_properties(catalog, catalog_uri, root, s3_endpoint, s3_region)
        self.namespace = namespace_setting(catalog_namespace)
        super().__init__(root, s3_endpoint, s3_region)
        self._tables: OutputTables | None = None
        # (table, date) -> the staged snapshot its checks read (see ``reading``).
        self._reading_at: dict[tuple[str, str], int] = {}

    def __getstate__(self) -> dict:
        # A store travels to Ray workers (a model loader holds one); its catalog connection
        # does not pickle, and a worker opens its own if it ever needs the tables.
        state = dict(self.__dict__)
        state["_tables"], state["_reading_at"] = None, {}
        return state

    @property
    def tables(self) -> OutputTables:
        if self._tables is None:
            under = tables_root(self.root)
            self._tables = OutputTables(
                open_catalog(self.catalog_props), lambda name: f"{under}/{name}", self.namespace
            )
        return self._tables

    def partition_target(self, asset: str, date: str) -> PartitionTarget:
        """The day's data folder in its table, its staging area, lease and table."""
        asset_dir = self.path("outputs", asset)
        return PartitionTarget(
            fs=self.fs,
            final_dir=f"{asset_dir}/data/date={date}",
            staging_dir=f"{asset_dir}/_staging/date={date}",
            lease_path=f"{asset_dir}/_leases/date={date}.json",
            cas=self.cas(),
            uri_prefix=self._scheme,
            table=DayTable(self.tables, asset, date),
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
        self,
        asset: str,
        date: str,
        batches: Iterable[pa.RecordBatch | pa.Table],
        schema: pa.Schema,
        audit: bool = False,
    ) -> Published:
        """Writes a whole partition and commits it in one step (no checkpoints).

        Re-running a partition replaces it; it never appends. If writing fails, nothing is
        committed and the previously published partition stays as it was. With ``audit`` the
        day is only staged (``Published.staged``): the caller reads it there, runs its checks
        and publishes or rejects it.
        """
        writer = ShardedWriter(
            ShardFileTargets(self.partition_target(asset, date), schema),
            uuid.uuid4().hex,
            shard_rows=0,
            lineage=f"publish-{uuid.uuid4().hex}",
            audit=audit,
        )
        writer.begin()
        report = None
        try:
            tables = (b if isinstance(b, pa.Table) else pa.Table.from_batches([b]) for b in batches)
            writer.write_shard(0, tables, rows_in=0)
            report = writer.commit(1)
        finally:
            writer.close()
            if report is None or report.staged is None:
                # A staged day keeps its staging until it is published or rejected.
                writer.discard_staging()
        return Published(
            uri=report.uri,
            rows=report.rows_out,
            files=1,
            snapshots=report.published_ids,
            staged=report.staged,
        )

    @contextmanager
    def reading(self, staged: StagedDay | None) -> Iterator[None]:
        """Reads of the staged day's tables see its staged snapshots inside the block: what a
        day's checks run on before it is published."""
        with self.pinned(staged.snapshots() if staged is not None else {}):
            yield

    @contextmanager
    def pinned(self, snapshots: dict[tuple[str, str], int]) -> Iterator[None]:
        """Reads of each ``(table, date)`` inside the block are at its snapshot: a staged day
        under audit, or the days a downstream asset was handed (``assets.handed``)."""
        before = {key: self._reading_at.get(key) for key in snapshots}
        self._reading_at.update(snapshots)
        try:
            yield
        finally:
            for key, snapshot_id in before.items():  # an enclosing block's pins come back
                if snapshot_id is None:
                    self._reading_at.pop(key, None)
                else:
                    self._reading_at[key] = snapshot_id

    def _snapshot(self, asset: str, date: str) -> int | None:
        return self._reading_at.get((asset, date))

    def _day_written(self, asset: str, date: str) -> bool:
        if self._snapshot(asset, date) is not None:
            return True
        if self.tables.current(asset, date) is not None:
            return True
        self._refuse_old_layout(asset, date)
        return False

    def _refuse_old_layout(self, asset: str, date: str) -> None:
        old = self.path("outputs", asset, f"date={date}")
        if self.exists(f"{old}/_manifest.json"):
            raise TableError(
                f"'{asset}' {date} was published in the old folder layout ({self.uri(old)}), "
                f"not in its Iceberg table: import it with `nightshift outputs import --asset "
                f"{asset}`, or re-run the day"
            )

    def output_files(self, asset: str, date: str) -> list[str]:
        """The day's data files in its table (paths on this store's filesystem)."""
        files = self.tables.files(asset, date, self._snapshot(asset, date))
        if files is None:
            self._refuse_old_layout(asset, date)
            return []
        return [f.split("://", 1)[1] if "://" in f else f for f in files]

    def output_commit(self, asset: str, date: str) -> str | None:
        """The commit id of the day on main (or the staged one being read); None without it."""
        pinned = self._snapshot(asset, date)
        if pinned is not None:
            found = self.tables.snapshot(asset, pinned)
            return found.commit if found else None
        current = self.tables.current(asset, date)
        return current.commit if current else None

    def output_columns(self, asset: str) -> list[str]:
        """The output's own columns, without its table's day column."""
        schema = self.tables.schema(asset)
        return schema.names if schema is not None else []

    def output_figures(self, asset: str, date: str) -> DaySnapshot | None:
        """The snapshot that put the day on main, with the figures the engine recorded in its
        summary (rows, statistics, fingerprint, model version); None when main has no such day."""
        return self.tables.current(asset, date)

    def read_output(self, asset: str, date: str) -> pa.Table:
        rows = self.tables.read(asset, date, self._snapshot(asset, date))
        if rows is None:
            self._refuse_old_layout(asset, date)
            raise FileNotFoundError(
                f"no published output for '{asset}', date {date} in table "
                f"{self.tables.identifier(asset)}"
            )
        return rows

    def output_exists(self, asset: str, date: str) -> bool:
        return self._day_written(asset, date)
