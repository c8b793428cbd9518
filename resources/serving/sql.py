"""The serving contract implemented once for SQL stores (SQLite, PostgreSQL).

A published day is served as a new *version*: its own table ``<asset>__v<N>``, loaded in one
transaction together with its row in the registry table ``serving_versions``. The name readers
query, ``<asset>``, is a view over the current version, replaced in one transaction (SQLite and
PostgreSQL both roll DDL back): a reader sees the old version or the new one, never a mix, and a
load that is killed or loses its store never commits, so nothing current changes. Rows with
vectors store each as the bytes of its floats, and their ANN index in ``<asset>__v<N>__ann``,
created in the same transaction and dropped with the version's table.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import pyarrow as pa

from resources.serving.target import (
    VECTOR_COLUMN,
    Day,
    ServingError,
    ServingTarget,
    Version,
    ann_parts,
    is_vector_type,
    schema_of,
    vectors_from_bytes,
    vectors_to_bytes,
)

REGISTRY = "serving_versions"


def table_name(asset: str, version: int) -> str:
    return f"{asset}__v{version}"


def ann_table(table: str) -> str:
    """The side table holding version ``table``'s ANN index, in parts."""
    return f"{table}__ann"


class SqlTarget(ServingTarget):
    """The serving contract on a SQL store; a subclass is one SQL dialect.

    A subclass provides ``address``, ``fix``, ``_connect`` and the dialect's column types,
    placeholder and lock; everything else (versions, the view swap, rollback, keeping) is here.
    """

    # ----- what a dialect provides -------------------------------------------------------
    placeholder: ClassVar[str] = "?"
    blob_type: ClassVar[str] = "BLOB"

    def _connect(self):
        raise NotImplementedError

    def _column_type(self, kind: pa.DataType) -> str:
        raise NotImplementedError

    def _begin(self, cursor, exclusive: bool) -> None:
        """Starts the transaction (a dialect that starts one by itself does nothing)."""

    def _lock(self, cursor) -> None:
        """Makes this the one transaction changing versions; readers go on reading."""

    def _insert_rows(self, cursor, table: str, columns: Sequence[str], rows: list[tuple]) -> None:
        marks = ", ".join([self.placeholder] * len(columns))
        cursor.executemany(f'INSERT INTO "{table}" VALUES ({marks})', rows)

    def _to_python(self, kind: pa.DataType, values: list) -> list:
        return values

    def _from_python(self, kind: pa.DataType, values: list) -> list:
        return values

    def _cells(self, kind: pa.DataType, values: list) -> list:
        """A column's values as stored: vectors as the bytes of their floats."""
        return (
            vectors_to_bytes(kind, values)
            if is_vector_type(kind)
            else self._to_python(kind, values)
        )

    def _uncells(self, kind: pa.DataType, values: list) -> list:
        if is_vector_type(kind):
            return vectors_from_bytes(kind, values)
        return self._from_python(kind, values)

    def _sql_type(self, kind: pa.DataType) -> str:
        return self.blob_type if is_vector_type(kind) else self._column_type(kind)

    # ----- connections -------------------------------------------------------------------
    @contextmanager
    def _transaction(self, exclusive: bool = False) -> Iterator[Any]:
        """A cursor inside one transaction: committed when the block ends, rolled back when it
        raises (or never committed when the process dies)."""
        try:
            connection = self._connect()
        except Exception as exc:
            raise self._unreachable(exc) from exc
        try:
            cursor = connection.cursor()
            self._begin(cursor, exclusive)
            self._ensure_registry(cursor)
            if exclusive:
                self._lock(cursor)
            yield cursor
            connection.commit()
        except BaseException:
            try:
                connection.rollback()
            except Exception:  # the store went away: its transaction is gone with it
                pass
            raise
        finally:
            connection.close()

    def _session(self):
        return self._transaction()

    def _ensure_registry(self, cursor) -> None:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {REGISTRY} ("
            "asset TEXT NOT NULL, version INTEGER NOT NULL, table_name TEXT NOT NULL, "
            "partition_key TEXT NOT NULL, commit_id TEXT NOT NULL, model_version TEXT NOT NULL, "
            "checks TEXT NOT NULL, row_count INTEGER NOT NULL, arrow_schema TEXT NOT NULL, "
            "loaded_at TEXT NOT NULL, load_seconds DOUBLE PRECISION NOT NULL, "
            "is_current INTEGER NOT NULL, previous INTEGER, dropped INTEGER NOT NULL, "
            "PRIMARY KEY (asset, version))"
        )

    # ----- the contract ------------------------------------------------------------------
    def _load(self, asset: str, rows: pa.Table, day: Day) -> Version:
        """Loads the version in one transaction with its registry row (and its ANN index, for
        rows with vectors: built before, stored inside)."""
        key = self.key_column(asset, rows)
        ann = self.ann_payload(asset, rows)
        p = self.placeholder
        with self._transaction(exclusive=True) as cur:
            cur.execute(
                f"SELECT COALESCE(MAX(version), 0) FROM {REGISTRY} WHERE asset = {p}", (asset,)
            )
            version = int(cur.fetchone()[0]) + 1
            table = table_name(asset, version)
            columns = ", ".join(f'"{f.name}" {self._sql_type(f.type)}' for f in rows.schema)
            cur.execute(f'CREATE TABLE "{table}" ({columns})')
            loaded = 0
            for batch in rows.to_batches(max_chunksize=self.batch_rows):
                values = [
                    self._cells(f.type, batch.column(i).to_pylist())
                    for i, f in enumerate(rows.schema)
                ]
                self._insert_rows(cur, table, rows.column_names, list(zip(*values, strict=True)))
                loaded += batch.num_rows
                day.loaded(loaded)
            if key is not None:
                cur.execute(f'CREATE INDEX "{table}__{key}" ON "{table}" ("{key}")')
            if ann is not None:
                side = ann_table(table)
                cur.execute(
                    f'CREATE TABLE "{side}" (part INTEGER PRIMARY KEY, data {self.blob_type})'
                )
                for part, data in enumerate(ann_parts(ann)):
                    cur.execute(f'INSERT INTO "{side}" VALUES ({p}, {p})', (part, data))
            r = day.record(rows)
            cur.execute(
                f"INSERT INTO {REGISTRY} VALUES ({', '.join([p] * 14)})",
                (
                    asset, version, table, r["partition"], r["commit"], r["model_version"],
                    json.dumps(r["checks"], sort_keys=True), r["rows"], r["arrow_schema"],
                    r["loaded_at"], r["load_seconds"], 0, None, 0,
                ),
            )  # fmt: skip
        return self.version(asset, version)

    def make_current(self, asset: str, version: int) -> Version:
        """Points the readers' view ``<asset>`` at ``version`` in one transaction, then drops
        the versions beyond ``keep_versions``."""
        asset = self._checked(asset)
        with self._transaction(exclusive=True) as cur:
            target = self._row(cur, asset, version)
            if target is None or target.dropped:
                raise ServingError(f"{asset}: no version {version} to make current")
            before = self._current(cur, asset)
            self._point_view(cur, asset, target)
            p = self.placeholder
            cur.execute(f"UPDATE {REGISTRY} SET is_current = 0 WHERE asset = {p}", (asset,))
            cur.execute(
                f"UPDATE {REGISTRY} SET is_current = 1 WHERE asset = {p} AND version = {p}",
                (asset, version),
            )
            if before is not None and before.version != version:
                # What a rollback of this version goes back to.
                cur.execute(
                    f"UPDATE {REGISTRY} SET previous = {p} WHERE asset = {p} AND version = {p}",
                    (before.version, asset, version),
                )
        self.drop_old(asset)
        return self.version(asset, version)

    def rollback(self, asset: str, date: str) -> Version:
        """Makes the version that was current before the current one current again, in one
        step; ``date`` must be the current version's partition."""
        asset = self._checked(asset)
        with self._transaction(exclusive=True) as cur:
            previous = self._rollback_to(
                asset,
                date,
                self._current(cur, asset),
                lambda version: self._previous(cur, asset, version),
            )
            self._point_view(cur, asset, previous)
            p = self.placeholder
            cur.execute(f"UPDATE {REGISTRY} SET is_current = 0 WHERE asset = {p}", (asset,))
            cur.execute(
                f"UPDATE {REGISTRY} SET is_current = 1 WHERE asset = {p} AND version = {p}",
                (asset, previous.version),
            )
        return self.version(asset, previous.version)

    def _read(self, cur, current: Version) -> pa.Table:
        p = self.placeholder
        cur.execute(
            f"SELECT arrow_schema FROM {REGISTRY} WHERE asset = {p} AND version = {p}",
            (current.asset, current.version),
        )
        schema = schema_of(cur.fetchone()[0])
        cur.execute(f'SELECT * FROM "{current.asset}"')
        rows = cur.fetchall()
        columns = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
        return pa.table(
            [
                pa.array(self._uncells(f.type, list(values)), f.type)
                for f, values in zip(schema, columns, strict=True)
            ],
            schema=schema,
        )

    def drop_old(self, asset: str) -> list[int]:
        """Drops the versions beyond the newest ``keep_versions``, never the current one."""
        asset = self._checked(asset)
        with self._transaction(exclusive=True) as cur:
            beyond = self._beyond_kept(self._rows(cur, asset))
            p = self.placeholder
            for old in beyond:
                cur.execute(f'DROP TABLE IF EXISTS "{old.table}"')
                cur.execute(f'DROP TABLE IF EXISTS "{ann_table(old.table)}"')
                cur.execute(
                    f"UPDATE {REGISTRY} SET dropped = 1 WHERE asset = {p} AND version = {p}",
                    (asset, old.version),
                )
        return [v.version for v in beyond]

    def _ann_bytes(self, cur, current: Version) -> bytes | None:
        p = self.placeholder
        cur.execute(
            f"SELECT arrow_schema FROM {REGISTRY} WHERE asset = {p} AND version = {p}",
            (current.asset, current.version),
        )
        schema = schema_of(cur.fetchone()[0])
        if VECTOR_COLUMN not in schema.names or not is_vector_type(
            schema.field(VECTOR_COLUMN).type
        ):
            return None
        cur.execute(f'SELECT data FROM "{ann_table(current.table)}" ORDER BY part')
        return b"".join(bytes(part) for (part,) in cur.fetchall())

    # ----- inside a transaction ----------------------------------------------------------
    def _point_view(self, cur, asset: str, version: Version) -> None:
        cur.execute(f'DROP VIEW IF EXISTS "{asset}"')
        cur.execute(f'CREATE VIEW "{asset}" AS SELECT * FROM "{version.table}"')

    _FIELDS: ClassVar[str] = (
        "asset, version, table_name, partition_key, commit_id, model_version, checks, "
        "row_count, loaded_at, load_seconds, is_current, dropped, previous"
    )

    def _rows(self, cur, asset: str, where: str = "", args: tuple = ()) -> list[Version]:
        cur.execute(
            f"SELECT {self._FIELDS} FROM {REGISTRY} WHERE asset = {self.placeholder}{where} "
            "ORDER BY version DESC",
            (asset, *args),
        )
        return [
            Version(
                asset=r[0],
                version=int(r[1]),
                table=r[2],
                partition=r[3],
                commit=r[4],
                model_version=r[5],
                checks=json.loads(r[6]),
                rows=int(r[7]),
                loaded_at=r[8],
                load_seconds=float(r[9]),
                current=bool(r[10]),
                dropped=bool(r[11]),
            )  # fmt: skip
            for r in cur.fetchall()
        ]

    def _row(self, cur, asset: str, version: int) -> Version | None:
        found = self._rows(cur, asset, f" AND version = {self.placeholder}", (version,))
        return found[0] if found else None

    def _current(self, cur, asset: str) -> Version | None:
        found = self._rows(cur, asset, " AND is_current = 1")
        return found[0] if found else None

    def _previous(self, cur, asset: str, version: int) -> Version | None:
        """The version that was current before ``version`` was made current, if still kept."""
        cur.execute(
            f"SELECT previous FROM {REGISTRY} WHERE asset = {self.placeholder} "
            f"AND version = {self.placeholder}",
            (asset, version),
        )
        found = cur.fetchone()
        if found is None or found[0] is None:
            return None
        previous = self._row(cur, asset, int(found[0]))
        return None if previous is None or previous.dropped else previous
