"""Outputs as Apache Iceberg tables: one table per output, partitioned by day, each day replaced
in one catalog commit, with write-audit-publish through a branch per commit.

A day is first *staged*: its data files are added, as one snapshot, to a new branch
``audit-<date>-<commit>`` that main never sees. The engine's shard files become those data files
as they are (``stage_files``); rows held in memory are written through the table (``stage``).
The day's checks read exactly that snapshot. *Publishing* then replaces the day on main with the
staged snapshot's data files in one transaction (delete the day, append the audited files): a
reader of main sees the old day or the new one, never none, both or a mix, and a day
whose checks failed is never on main; its snapshot stays on its branch for inspection.

Publishing appends the audited files onto main's current snapshot instead of moving main to
the audit snapshot itself, because other days of the same table may have been published since
the branch was cut (a backfill across nodes); the files, and so the rows, are the audited ones.

Every snapshot nightshift makes carries its commit id, the day, the fingerprint of what decided
the output and the day's figures in its summary (``nightshift.*``), so history and rollback are
questions to the table's metadata.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import itertools
import json
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from inference.engine.diskspace import writing

NAMESPACE = "nightshift"
DATE = "date"
PREFIX = "nightshift."
COMMIT, DAY, KIND = f"{PREFIX}commit", f"{PREFIX}date", f"{PREFIX}kind"
ARROW_SCHEMA = f"{PREFIX}arrow-schema"
AUDIT_BRANCH, REJECTED_BRANCH = "audit-", "rejected-"
# The kinds of snapshot that publishing and rollback make on main; "staged" ones live on
# branches only.
ON_MAIN = ("published", "rolled back")
# Many nodes committing days of one table at once (a backfill across nodes) conflict on the
# catalog pointer. pyiceberg 0.12's own retry rebuilds a transaction of several snapshots with
# stale sequence numbers ("Cannot add snapshot with sequence number 7 older than last sequence
# number 9"), so it is off, and each operation is redone whole on a fresh table instead
# (``OutputTables._committed``).
COMMIT_TRIES = 60
TABLE_PROPERTIES = {
    "commit.retry.num-retries": "0",
    # Every commit writes a new metadata file: keep the last ones only (upkeep deletes the
    # rest of what expired snapshots leave, see inference/engine/table_upkeep.py).
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}


class TableError(RuntimeError):
    """An output table cannot be read or written as asked (named in the message)."""


class SupersededError(TableError):
    """A staged day not published because main already holds work that came after it: a
    commit of the day staged later (another run that finished first), or a rollback made
    since; publishing it would put older work back."""


@dataclass(frozen=True)
class DaySnapshot:
    """A snapshot that wrote one day: its id, commit, kind (staged, published, rolled back)
    and the figures nightshift recorded in its summary."""

    snapshot_id: int
    commit: str
    date: str
    kind: str
    timestamp_ms: int
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def when(self) -> str:
        return dt.datetime.fromtimestamp(self.timestamp_ms / 1000, dt.UTC).isoformat(
            timespec="seconds"
        )

    def text(self, name: str, default: str = "") -> str:
        """A figure recorded as text (commit, fingerprint, lineage, model version)."""
        return self.properties.get(f"{PREFIX}{name}", default)

    def value(self, name: str, default: Any = None) -> Any:
        """A figure recorded as JSON (row counts, statistics, check results)."""
        raw = self.properties.get(f"{PREFIX}{name}")
        return default if raw is None else json.loads(raw)


def _properties(figures: dict[str, Any]) -> dict[str, str]:
    """Snapshot summary properties are strings: each figure JSON-encoded under ``nightshift.``."""
    return {
        f"{PREFIX}{key}": value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        for key, value in figures.items()
    }


def _day_snapshot(snapshot) -> DaySnapshot | None:
    props = dict(snapshot.summary.additional_properties) if snapshot.summary else {}
    if DAY not in props:
        return None
    return DaySnapshot(
        snapshot.snapshot_id,
        props.get(COMMIT, ""),
        props[DAY],
        props.get(KIND, ""),
        snapshot.timestamp_ms,
        props,
    )


def _encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _decode_schema(raw: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw)))


def _with_date(table: pa.Table, schema: pa.Schema, date: str) -> pa.Table:
    table = table.select(schema.names).cast(schema)
    day = pa.array([dt.date.fromisoformat(date)] * table.num_rows, pa.date32())
    return table.append_column(pa.field(DATE, pa.date32()), day)


def _day_number(date: str) -> int:
    """An identity partition on a date holds days since the epoch."""
    return (dt.date.fromisoformat(date) - dt.date(1970, 1, 1)).days


# Where parquet keeps a column's field id, as pyarrow reads and writes it in field metadata.
FIELD_ID = b"PARQUET:field_id"


def with_field_ids(schema: pa.Schema, columns) -> pa.Schema:
    """``schema`` with each field, nested ones too, carrying the field id of its column in the
    Iceberg schema ``columns`` (matched by name): a parquet file written in it is one of the
    table's own data files, read by id as the spec has readers do (a strict catalog refuses a
    file without ids; the table's name mapping serves only files written before)."""
    from pyiceberg.types import ListType, MapType, StructType

    def annotate(column: pa.Field, field_id: int, kind) -> pa.Field:
        t = column.type
        if pa.types.is_struct(t) and isinstance(kind, StructType):
            t = pa.struct([_child(t.field(i), kind) for i in range(t.num_fields)])
        elif isinstance(kind, ListType) and (
            pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
        ):
            item = annotate(t.value_field, kind.element_id, kind.element_type)
            if pa.types.is_fixed_size_list(t):
                t = pa.list_(item, t.list_size)
            else:
                t = pa.large_list(item) if pa.types.is_large_list(t) else pa.list_(item)
        elif pa.types.is_map(t) and isinstance(kind, MapType):
            key = annotate(t.key_field, kind.key_id, kind.key_type)
            value = annotate(t.item_field, kind.value_id, kind.value_type)
            t = pa.map_(key, value)
        metadata = {**(column.metadata or {}), FIELD_ID: str(field_id).encode()}
        return pa.field(column.name, t, column.nullable, metadata=metadata)

    def _child(child: pa.Field, struct) -> pa.Field:
        found = struct.field_by_name(child.name)
        return annotate(child, found.field_id, found.field_type)

    fields = []
    for top in schema:
        column = columns.find_field(top.name)
        fields.append(annotate(top, column.field_id, column.field_type))
    return pa.schema(fields, metadata=schema.metadata)


def _field_ids(schema: pa.Schema) -> list[bytes | None]:
    """Every field's parquet field id, nested ones too, in order (a list's item is named
    ``element`` once written: ids, not names, say which column is which)."""
    found: list[bytes | None] = []

    def walk(column: pa.Field) -> None:
        found.append((column.metadata or {}).get(FIELD_ID))
        t = column.type
        if pa.types.is_struct(t):
            children = [t.field(i) for i in range(t.num_fields)]
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            children = [t.value_field]
        elif pa.types.is_map(t):
            children = [t.key_field, t.item_field]
        else:
            children = []
        for child in children:
            walk(child)

    for top in schema:
        walk(top)
    return found


def _registered(metadata, io, file: str, schema: pa.Schema, date: str, write_uuid, counter):
    """The data files that hold ``file`` in the table: the file itself, described from its
    footer, when its columns are ``schema``'s and carry the table's field ids
    (:func:`with_field_ids`); otherwise its rows written again in the table's own files."""
    import pyarrow.parquet as pq
    from pyiceberg.conversions import to_bytes
    from pyiceberg.io.pyarrow import (
        _dataframe_to_data_files,
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    source = io.new_input(file)
    with source.open() as stream:
        footer = pq.read_metadata(stream)
    columns = metadata.schema()
    found = footer.schema.to_arrow_schema()
    if not found.equals(schema) or _field_ids(found) != _field_ids(with_field_ids(schema, columns)):
        with source.open() as stream:
            rows = pq.read_table(stream)
        try:
            dated = _with_date(rows, schema, date)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, KeyError) as exc:
            raise TableError(
                f"{file}: its columns {rows.schema} do not fit the table's {schema}: {exc}"
            ) from exc
        yield from _dataframe_to_data_files(
            metadata, dated, io, write_uuid=write_uuid, counter=counter
        )
        return
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer,
        stats_columns=compute_statistics_plan(columns, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(columns),
    ).to_serialized_dict()
    # The file has no ``date`` column, yet every row it gives a reader has the day: its
    # bounds say so, which lets a delete of the day drop the file from the metadata alone.
    day = columns.find_field(DATE)
    bound = to_bytes(day.field_type, _day_number(date))
    statistics["lower_bounds"][day.field_id] = statistics["upper_bounds"][day.field_id] = bound
    statistics["value_counts"][day.field_id] = footer.num_rows
    statistics["null_value_counts"][day.field_id] = 0
    yield DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=file,
        file_format=FileFormat.PARQUET,
        partition=Record(_day_number(date)),
        file_size_in_bytes=len(source),
        sort_order_id=None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics,
    )


def _day_filter(date: str):
    from pyiceberg.expressions import EqualTo

    return EqualTo(DATE, date)


def bare_path(uri: str) -> str:
    """A table file's URI as a path on its filesystem (``s3://b/k`` -> ``b/k``, as pyarrow's)."""
    return uri.split("://", 1)[1] if "://" in uri else uri


def local_location(uri: str) -> bool:
    """Whether a table location is a local path (``file://``, or no scheme at all)."""
    return "://" not in uri or uri.startswith("file:")


def day_folder(table, date: str) -> str:
    """The folder of ``date``'s data files in ``table``, under the table's own location (which
    a catalog may choose itself), as a path on its filesystem."""
    return f"{bare_path(table.location()).rstrip('/')}/data/{DATE}={date}"


class OutputTables:
    """The output tables of one catalog.

    Args:
        catalog: a pyiceberg catalog (SQL on SQLite by default, Glue, REST).
        location: where a new table's files live, from its name (``<data_root>/outputs/<name>``);
            a catalog that assigns locations itself (some REST catalogs) is given none.
        namespace: the catalog namespace of the tables (dotted for a nested one).
    """

    def __init__(self, catalog, location: Callable[[str], str], namespace: str = NAMESPACE):
        self.catalog = catalog
        self.location = location
        self.namespace = namespace

    def identifier(self, name: str) -> str:
        return f"{self.namespace}.{name}"

    def file_schema(self, name: str, schema: pa.Schema) -> pa.Schema:
        """The schema to write the table's data files in: ``schema`` with the table's field
        ids (:func:`with_field_ids`); the table is created or its schema merged first."""
        return with_field_ids(schema, self.ensure(name, schema).schema())

    def load(self, name: str):
        """The table, or None when nothing was ever written to it.

        Raises:
            TableError: the catalog refused this client (no or a wrong token), naming the
                catalog and where its credentials are set.
        """
        from pyiceberg.exceptions import (
            AuthorizationExpiredError,
            NoSuchNamespaceError,
            NoSuchTableError,
            OAuthError,
            UnauthorizedError,
        )

        try:
            return self.catalog.load_table(self.identifier(name))
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        except (UnauthorizedError, OAuthError, AuthorizationExpiredError) as exc:
            where = self.catalog.properties.get("uri", "")
            raise TableError(
                f"the catalog at {where} refused to load {self.identifier(name)}: {exc}. A REST "
                "catalog's credentials are pyiceberg's settings of the catalog "
                f"'{self.catalog.name}': PYICEBERG_CATALOG__{self.catalog.name.upper()}__TOKEN "
                "(or __CREDENTIAL for OAuth2), in the environment of every process that runs "
                "the pipelines, or in ~/.pyiceberg.yaml"
            ) from exc

    def _committed(self, name: str, what: str, commit: Callable[[Any], Any], table=None):
        """Runs ``commit(table)`` on ``table`` (loaded when None) and, while another writer's
        commit got in first, again on a freshly loaded table; after ``COMMIT_TRIES`` tries the
        conflict is raised, naming ``what``. Returns what ``commit`` returns."""
        import random
        import time

        from pyiceberg.exceptions import CommitFailedException, RESTError

        for attempt in range(COMMIT_TRIES):
            if table is None:
                table = self.load(name)
                if table is None:
                    raise TableError(f"{what}: table {self.identifier(name)} is gone")
            try:
                with self._writing_metadata(name, table.location()):
                    return commit(table)
            except (CommitFailedException, ValueError, RESTError) as exc:
                # A commit built on metadata another writer has moved past is a conflict too,
                # though told as a sequence number that is no longer the next: pyiceberg's
                # ValueError (SQL catalog), a 422 from a REST server (Lakana).
                stale = "sequence number" in str(exc)
                if not (isinstance(exc, CommitFailedException) or stale):
                    raise
                if attempt == COMMIT_TRIES - 1:
                    raise TableError(
                        f"{what}: still conflicting after {COMMIT_TRIES} tries: {exc}"
                    ) from exc
                table = None
                time.sleep(random.uniform(0.01, 0.05) * min(2**attempt, 20))
        raise AssertionError("unreachable")

    def _writing_metadata(self, name: str, location: str):
        """Around a commit: running out of space writing the table's metadata files names the
        table, its metadata folder and the space left (see inference.engine.diskspace)."""
        folder = f"{location.rstrip('/')}/metadata"
        return writing(
            f"{bare_path(folder)}/next.metadata.json",
            f"table {self.identifier(name)}'s metadata at {folder}",
            local=local_location(location),
        )

    def schema(self, name: str) -> pa.Schema | None:
        """The output's own columns (without ``date``), or None when there is no table."""
        table = self.load(name)
        return None if table is None else _decode_schema(table.properties[ARROW_SCHEMA])

    def ensure(self, name: str, schema: pa.Schema):
        """The table for ``schema`` (the output's columns; ``date`` is added as its day
        partition), created on first use; a schema that gained columns is merged by name.

        The table is created partitioned in one catalog commit, so no other writer ever sees it
        unpartitioned; what follows (its name mapping, its first empty snapshot, a schema
        merge) is one more commit, redone on a fresh table when another writer's got in
        first (a backfill across nodes creating the table at once)."""
        from pyiceberg.catalog import Catalog
        from pyiceberg.exceptions import TableAlreadyExistsError
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.table import TableProperties
        from pyiceberg.transforms import IdentityTransform

        if DATE in schema.names:
            raise TableError(f"output '{name}' has a column named '{DATE}': that is its partition")
        encoded = _encode_schema(schema)
        table = self.load(name)
        if table is None:
            try:
                self.catalog.create_namespace_if_not_exists(self.namespace)
            except Exception:  # noqa: BLE001 - see below
                # Created by another process in between: the SQL catalog then raises its
                # database's unique-constraint error, not NamespaceAlreadyExistsError.
                if not self.catalog.namespace_exists(self.namespace):
                    raise
            full = Catalog._convert_schema_if_needed(schema.append(pa.field(DATE, pa.date32())))
            day = PartitionField(
                source_id=full.find_field(DATE).field_id,
                field_id=1000,
                transform=IdentityTransform(),
                name=DATE,
            )
            try:
                with self._writing_metadata(name, self.location(name)):
                    self._create(name, full, PartitionSpec(day), encoded)
            except TableAlreadyExistsError:
                pass

        def settle(table):
            unmapped = table.metadata.name_mapping() is None
            empty = table.current_snapshot() is None
            changed = table.properties.get(ARROW_SCHEMA) != encoded
            if not (unmapped or empty or changed):
                return table
            with table.transaction() as tx:
                if unmapped:
                    # Files registered as the engine wrote them carry no Iceberg field ids:
                    # readers match their columns to the table's by this mapping (schema
                    # updates keep it).
                    mapping = table.schema().name_mapping.model_dump_json()
                    tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})
                if changed:
                    with tx.update_schema() as update:
                        update.union_by_name(schema)
                    tx.set_properties({ARROW_SCHEMA: encoded})
                if empty:  # a branch can only be cut from a table with a snapshot on main
                    with tx.update_snapshot(snapshot_properties={KIND: "created"}).fast_append():
                        pass
            return table

        return self._committed(name, f"setting up {self.identifier(name)}", settle, table)

    def _create(self, name: str, schema, spec, encoded: str) -> None:
        """Creates the table at its location under the data root. A REST catalog that assigns
        locations itself refuses one (Lakana with a 422 naming it), and the table is then
        created where the catalog puts it; its days' files go there too (:func:`day_folder`)."""
        from pyiceberg.exceptions import CommitStateUnknownException, RESTError

        create = functools.partial(
            self.catalog.create_table,
            self.identifier(name),
            schema=schema,
            partition_spec=spec,
            properties={**TABLE_PROPERTIES, ARROW_SCHEMA: encoded},
        )
        try:
            create(location=self.location(name))
        except RESTError as refused:
            if isinstance(refused, CommitStateUnknownException):
                raise
            if "location" not in str(refused).lower():
                raise
            create()

    def stage(
        self,
        name: str,
        date: str,
        schema: pa.Schema,
        tables: Callable[[], Iterable[pa.Table]] | list[pa.Table],
        figures: dict[str, Any],
    ) -> DaySnapshot:
        """Writes the day's rows into the table's files as one new snapshot on an audit branch
        of its own; main is untouched. ``tables`` gives the rows (a function called again when
        a commit conflict makes the write start over, so that a day is never held whole in
        memory); ``figures`` must hold the ``commit`` id."""
        from pyiceberg.io.pyarrow import _dataframe_to_data_files

        def add(table, tx, append) -> None:
            counter = itertools.count()
            for rows in tables() if callable(tables) else tables:
                if not rows.num_rows:
                    continue
                for data_file in _dataframe_to_data_files(
                    tx.table_metadata,
                    _with_date(rows, schema, date),
                    table.io,
                    write_uuid=append.commit_uuid,
                    counter=counter,
                ):
                    append.append_data_file(data_file)

        return self._stage(name, date, schema, figures, add)

    def stage_files(
        self,
        name: str,
        date: str,
        schema: pa.Schema,
        files: list[str],
        figures: dict[str, Any],
        table=None,
    ) -> DaySnapshot:
        """Stages the day from parquet files already placed in the table's folder (the
        engine's shard files, linked there): each is registered as it is, from its footer, so
        no row is read or written again. The day's value lives in each file's partition
        record, as in a table migrated from Hive folders (the Iceberg spec has readers take an
        identity partition's value from there). A file whose columns are not ``schema``'s is
        rewritten through the table instead. One snapshot on the audit branch; main is
        untouched. ``table``: the table as :meth:`ensure` returned it, when the caller has it."""

        def add(table, tx, append) -> None:
            counter = itertools.count()
            for file in files:
                for data_file in _registered(
                    tx.table_metadata, table.io, file, schema, date, append.commit_uuid, counter
                ):
                    append.append_data_file(data_file)

        return self._stage(name, date, schema, figures, add, table)

    def _stage(
        self, name: str, date: str, schema: pa.Schema, figures: dict[str, Any], add, table=None
    ):
        """One snapshot on the day's audit branch holding the data files ``add`` appends (none:
        an empty day, which is still a day), redone whole on a commit conflict."""
        branch = f"{AUDIT_BRANCH}{date}-{figures['commit']}"
        props = _properties({**figures, "date": date, "kind": "staged"})

        def write(table):
            with table.transaction() as tx:
                update = tx.update_snapshot(snapshot_properties=props, branch=branch)
                with update.fast_append() as append:
                    add(table, tx, append)
            return table  # the commit left it at its new metadata

        what = f"staging {self.identifier(name)} {date}"
        table = table if table is not None else self.ensure(name, schema)
        table = self._committed(name, what, write, table)
        snapshot = _day_snapshot(table.snapshot_by_name(branch))
        assert snapshot is not None
        return snapshot

    def publish(self, name: str, date: str, staged: DaySnapshot, **figures: Any) -> DaySnapshot:
        """Makes a staged (or any earlier) snapshot's rows of ``date`` the day on main, in one
        commit; the other days of main are untouched."""
        table = self.load(name)
        if table is None or table.snapshot_by_id(staged.snapshot_id) is None:
            raise TableError(f"no snapshot {staged.snapshot_id} in table {self.identifier(name)}")
        files = _files_in_order(table, staged.snapshot_id, date)
        kind = figures.pop("kind", "published")
        props = {
            **{k: v for k, v in staged.properties.items() if k.startswith(PREFIX)},
            **_properties({**figures, "kind": kind, "from_snapshot": staged.snapshot_id}),
        }

        def replace_day(table):
            if kind == "published":
                # On the table this commit is built on, so no other publish can slip in
                # between the check and the commit (the catalog refuses a stale base).
                self._refuse_if_superseded(table, name, date, staged)
            with table.transaction() as tx:
                with warnings.catch_warnings():
                    # The day's first commit deletes nothing, and pyiceberg warns about it.
                    warnings.simplefilter("ignore", UserWarning)
                    # Dropped whole from the metadata (the day's bounds on ``date``), no data
                    # file is opened. A delete and an append, not one overwrite: pyiceberg's
                    # overwrite carries the manifests of its deletions into every later
                    # snapshot, where upkeep would never see the replaced files go.
                    tx.delete(_day_filter(date), snapshot_properties=props)
                with tx.update_snapshot(snapshot_properties=props).fast_append() as append:
                    for data_file in files:
                        append.append_data_file(data_file)
            return table

        what = f"publishing {self.identifier(name)} {date}"
        table = self._committed(name, what, replace_day, table)
        snapshot = _day_snapshot(table.current_snapshot())
        assert snapshot is not None
        return snapshot

    def _refuse_if_superseded(self, table, name: str, date: str, staged: DaySnapshot) -> None:
        """Raises SupersededError when the day on main came after ``staged``: it was staged
        later (two runs of one day, the later one published first), or it is a rollback made
        since. Runs of a day stage and publish under no common lock (the lease covers the
        writing only; checks run between), so the order they were staged in, which the
        table's sequence numbers keep, decides; a publish never puts older work back."""
        head = day_heads(table).get(date)
        ours = table.snapshot_by_id(staged.snapshot_id)
        if head is None or ours is None:
            return
        if head.kind == "published":
            source = head.value("from_snapshot")
            came = table.snapshot_by_id(int(source)) if source is not None else None
        else:  # a rollback is a person's decision, made when it was made
            came = table.snapshot_by_id(head.snapshot_id)
        # An expired source was staged before the retention: older than anything staged now.
        if came is None or came.sequence_number <= ours.sequence_number:
            return
        how = "rolled back to since" if head.kind != "published" else "staged after it"
        raise SupersededError(
            f"{self.identifier(name)} {date}: commit {staged.commit} (staged as snapshot "
            f"{staged.snapshot_id}) is not published: main holds commit {head.commit} "
            f"(snapshot {head.snapshot_id}), {how}, and publishing would put older work back; "
            f"the staged day stays on branch {AUDIT_BRANCH}{date}-{staged.commit}"
        )

    def reject(self, name: str, date: str, staged: DaySnapshot) -> str:
        """Keeps a staged snapshot that failed its checks under a branch named for it
        (``rejected-<date>-<commit>``), off main; returns the branch's name."""
        table = self.load(name)
        branch = f"{REJECTED_BRANCH}{date}-{staged.commit}"
        audit = f"{AUDIT_BRANCH}{date}-{staged.commit}"
        update = table.manage_snapshots().create_branch(staged.snapshot_id, branch)
        if audit in table.metadata.refs:
            update = update.remove_branch(audit)
        update.commit()
        return branch

    def rollback(self, name: str, date: str, to_commit: str | None = None) -> DaySnapshot:
        """Makes an earlier commit of ``date`` the day on main again, in one commit (the other
        days are untouched): ``to_commit``, else the one published before the current one.

        Raises:
            TableError: the table, the day or the commit is not there (the message lists the
                day's commits).
        """
        history = self.history(name, date)
        current = next((day for day, where in history if where == "current"), None)
        if to_commit is None:
            earlier = [
                day
                for day, where in history
                if where == "published" and (current is None or day.commit != current.commit)
            ]
            if current is None or not earlier:
                raise TableError(
                    f"{self.identifier(name)} {date}: no earlier published commit to roll back "
                    f"to{_listing(history)}"
                )
            target = earlier[0]
        else:
            found = [day for day, _ in history if day.commit == to_commit]
            if not found:
                raise TableError(
                    f"{self.identifier(name)} {date}: no commit {to_commit}{_listing(history)}"
                )
            target = found[0]
        return self.publish(
            name,
            date,
            target,
            kind="rolled back",
            rolled_back_from=current.commit if current else "",
        )

    def current(self, name: str, date: str) -> DaySnapshot | None:
        """The snapshot that last wrote ``date`` on main, or None when main has no such day."""
        table = self.load(name)
        return None if table is None else _current(table, date)

    def snapshot(self, name: str, snapshot_id: int) -> DaySnapshot | None:
        table = self.load(name)
        if table is None:
            return None
        found = table.snapshot_by_id(snapshot_id)
        return None if found is None else _day_snapshot(found)

    def history(self, name: str, date: str) -> list[tuple[DaySnapshot, str]]:
        """Every snapshot that wrote ``date``, newest first, each with where it stands:
        ``current`` (main's day), ``published`` (was main's day), ``staged`` or ``rejected``
        (never on main)."""
        table = self.load(name)
        if table is None:
            return []
        rejected = {
            ref.snapshot_id
            for ref_name, ref in table.metadata.refs.items()
            if ref_name.startswith(REJECTED_BRANCH)
        }
        current = _current(table, date)
        rows, staged_commits = [], set()
        for found in sorted(table.snapshots(), key=lambda s: -(s.sequence_number or 0)):
            day = _day_snapshot(found)
            if day is None or day.date != date or _only_deletes(found):
                continue
            where = None
            if current is not None and day.snapshot_id == current.snapshot_id:
                where = "current"
            elif day.kind in ON_MAIN:
                where = "published"
            if where in ("current", "published"):
                # Its staged snapshot (older, listed below) is the same commit: not listed.
                staged_commits.add(day.commit)
            else:
                # A day staged before its shard files were registered whole is one snapshot
                # per shard on its branch, newest first here: the branch's head stands for it.
                if day.commit in staged_commits:
                    continue
                staged_commits.add(day.commit)
                where = "rejected" if found.snapshot_id in rejected else day.kind or "staged"
            rows.append((day, where))
        return rows

    def scan_day(self, name: str, date: str, snapshot_id: int | None = None):
        """The scan of one day at ``snapshot_id`` (default: main's), or None when the table or
        the day is not there."""
        table = self.load(name)
        if table is None:
            return None, None
        if snapshot_id is None:
            current = _current(table, date)
            if current is None:
                return table, None
            snapshot_id = table.current_snapshot().snapshot_id
        return table, table.scan(snapshot_id=snapshot_id, row_filter=_day_filter(date))

    def _tasks(self, name: str, date: str, snapshot_id: int | None):
        """The table and the day's file scan tasks at ``snapshot_id`` (main's by default), in
        the order the rows were written; (None, None) when there is no such day."""
        from pyiceberg.table import FileScanTask

        table, scan = self.scan_day(name, date, snapshot_id)
        if scan is None:
            return table, None, None
        if snapshot_id is None:
            # Publishing appends the day's files in one manifest, in the order they were
            # written: main's plan keeps it.
            return table, scan, list(scan.plan_files())
        # A staged snapshot holds one manifest per shard, listed newest first.
        files = _files_in_order(table, snapshot_id, date)
        return table, scan, [FileScanTask(f) for f in files]

    def files(self, name: str, date: str, snapshot_id: int | None = None) -> list[str] | None:
        """The day's data files (URIs) at ``snapshot_id`` (default: main's), in row order, or
        None when there is no such day."""
        _, _, tasks = self._tasks(name, date, snapshot_id)
        return None if tasks is None else [task.file.file_path for task in tasks]

    def read(self, name: str, date: str, snapshot_id: int | None = None) -> pa.Table | None:
        """The day's rows at ``snapshot_id`` (default: main's) in the output's own schema and
        in the order they were written, or None when there is no such day."""
        from pyiceberg.io.pyarrow import ArrowScan

        table, scan, tasks = self._tasks(name, date, snapshot_id)
        if tasks is None:
            return None
        schema = _decode_schema(table.properties[ARROW_SCHEMA])
        rows = ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter).to_table(
            tasks
        )
        return rows.drop_columns([DATE]).select(schema.names).cast(schema)


def _only_deletes(snapshot) -> bool:
    """The first half of a publish (the day's old files removed): not a version of the day."""
    from pyiceberg.table.snapshots import Operation

    return snapshot.summary is not None and snapshot.summary.operation == Operation.DELETE


def _listing(history: list[tuple[DaySnapshot, str]]) -> str:
    if not history:
        return " (the day has no commit)"
    return " (its commits: " + ", ".join(f"{d.commit} {w}" for d, w in history) + ")"


def _files_in_order(table, snapshot_id: int, date: str) -> list:
    """The data files of ``date`` live in a snapshot, in the order they were committed: by
    sequence number, and within one commit as its manifest lists them (the order they were
    added; their names need not sort that way)."""
    day = _day_number(date)
    entries = []
    for manifest in table.snapshot_by_id(snapshot_id).manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.partition[0] == day:
                entries.append(entry)
    entries.sort(key=lambda entry: entry.sequence_number or 0)  # stable: keeps that order
    return [entry.data_file for entry in entries]


def _current(table, date: str) -> DaySnapshot | None:
    """The newest snapshot that put ``date`` on main. Found by kind and sequence number, not
    by walking main's ancestry: expiry removes snapshots between the days' heads (and keeps
    every day's head), which would cut the walk short."""
    heads = day_heads(table)
    return heads.get(date)


def day_heads(table) -> dict[str, DaySnapshot]:
    """Each day's newest snapshot on main (published or rolled back), by day."""
    heads: dict[str, tuple[int, DaySnapshot]] = {}
    for snapshot in table.snapshots():
        day = _day_snapshot(snapshot)
        if day is None or day.kind not in ON_MAIN:
            continue
        order = snapshot.sequence_number or 0
        if day.date not in heads or order > heads[day.date][0]:
            heads[day.date] = (order, day)
    return {date: day for date, (_, day) in heads.items()}


@dataclass(frozen=True)
class DayTable:
    """One day of one output table: where a writer stages and publishes it."""

    tables: OutputTables
    name: str
    date: str

    def current(self) -> DaySnapshot | None:
        return self.tables.current(self.name, self.date)


@dataclass
class StagedDay:
    """A day staged in one or more tables (its companions first, the output itself last),
    waiting for its checks. ``publish`` puts every table's day on main, the output last, so a
    reader that sees the output's commit on main finds its companions' too; ``reject`` keeps
    the snapshots for inspection and leaves main as it was. ``done`` runs after either (it
    removes the day's staging area)."""

    parts: list[tuple[DayTable, DaySnapshot]] = field(default_factory=list)
    done: Callable[[], None] | None = None
    published: DaySnapshot | None = None
    rejected: str | None = None
    # table -> the snapshot that put the day on its main: what a downstream asset reads.
    published_ids: dict[str, int] = field(default_factory=dict)

    @property
    def date(self) -> str:
        """The day staged (its output's)."""
        return self.parts[-1][0].date if self.parts else ""

    @property
    def commit(self) -> str:
        return self.parts[-1][1].commit if self.parts else ""

    @property
    def snapshot_id(self) -> int | None:
        """The output's staged snapshot: what its checks read."""
        return self.parts[-1][1].snapshot_id if self.parts else None

    def snapshots(self) -> dict[tuple[str, str], int]:
        """``(table, date) -> staged snapshot``, for reading exactly what is being checked."""
        return {(day.name, day.date): snap.snapshot_id for day, snap in self.parts}

    def publish(self, **figures: Any) -> DaySnapshot | None:
        """Publishes every part; ``figures`` (check results, model version) go into each
        published snapshot's summary.

        Raises:
            SupersededError: main already holds later work of the day (see
                ``OutputTables.publish``). Parts are published in order and each is refused
                alike, and the later run publishes every part of its own, so the tables end
                on its commit together; this day's staging is left to that run's lease.
        """
        for day, snapshot in self.parts:
            self.published = day.tables.publish(day.name, day.date, snapshot, **figures)
            self.published_ids[day.name] = self.published.snapshot_id
        self._finish()
        return self.published

    def reject(self) -> str | None:
        for day, snapshot in self.parts:
            branch = day.tables.reject(day.name, day.date, snapshot)
        self.rejected = branch if self.parts else None
        self._finish()
        return self.rejected

    def _finish(self) -> None:
        done, self.done = self.done, None
        if done is None:
            return
        try:
            done()
        except OSError:
            # The day is published (or rejected) already; a staging area left behind (a full
            # disk at its lease) is only work a later run of the day resumes and replaces.
            pass
