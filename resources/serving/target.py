"""The contract every serving target keeps, implemented once for SQL stores.

A published day is served as a new *version*: its own table ``<asset>__v<N>``, loaded in one
transaction together with its row in the registry table ``serving_versions``. The name readers
query, ``<asset>``, is a view over the current version, replaced in one transaction (SQLite and
PostgreSQL both roll DDL back): a reader sees the old version or the new one, never a mix, and a
load that is killed or loses its store never commits, so nothing current changes.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa
from dagster import ConfigurableResource
from pydantic import Field

REGISTRY = "serving_versions"

# The column each served asset is looked up by: every version table is indexed on it.
SERVED_KEYS: dict[str, str] = {
    "user_recommendations": "user_id",
    "fraud_alerts": "transaction_id",
}

_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


class ServingError(RuntimeError):
    """A request the target refuses (an unknown asset, a rollback with nothing to go back to)."""


class ServingUnavailable(ServingError):
    """The store cannot be reached: retrying the same step will not help until it is back."""

    def __init__(self, address: str, fix: str, cause: BaseException):
        self.address, self.fix = address, fix
        super().__init__(f"serving store {address} is unreachable ({cause}); {fix}")


@dataclass(frozen=True)
class Version:
    """One loaded version of an asset and what it records about the day it serves."""

    asset: str
    version: int
    table: str
    partition: str
    commit: str
    model_version: str
    checks: dict[str, Any]
    rows: int
    loaded_at: str
    load_seconds: float
    current: bool
    dropped: bool


def table_name(asset: str, version: int) -> str:
    return f"{asset}__v{version}"


def _checked_name(asset: str) -> str:
    if not _NAME.match(asset):
        raise ServingError(f"not a servable asset name: {asset!r} (lower case, digits and _)")
    return asset


def _schema_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _schema_of(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


class ServingTarget(ConfigurableResource):
    """Where published days are served from; a subclass is one SQL dialect.

    A subclass provides ``address``, ``fix``, ``_connect`` and the dialect's column types,
    placeholder and lock; everything else (versions, the view swap, rollback, keeping) is here.
    """

    keep_versions: int = Field(
        3, ge=1, description="Versions kept per asset, newest first; older ones are dropped."
    )  # the current version is never dropped, however old
    batch_rows: int = Field(
        default=10_000, ge=1, description="Rows inserted per statement while a version loads."
    )

    # ----- what a dialect provides -------------------------------------------------------
    placeholder: ClassVar[str] = "?"

    def address(self) -> str:
        raise NotImplementedError

    def fix(self) -> str:
        raise NotImplementedError

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

    # ----- connections -------------------------------------------------------------------
    @contextmanager
    def _transaction(self, exclusive: bool = False) -> Iterator[Any]:
        """A cursor inside one transaction: committed when the block ends, rolled back when it
        raises (or never committed when the process dies)."""
        try:
            connection = self._connect()
        except Exception as exc:
            raise ServingUnavailable(self.address(), self.fix(), exc) from exc
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
    def load(
        self,
        asset: str,
        rows: pa.Table,
        *,
        partition: str,
        commit: str = "",
        model_version: str = "",
        checks: dict[str, Any] | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> Version:
        """Loads ``rows`` as a new version of ``asset`` (not yet current), in one transaction
        with its registry row. ``on_batch`` is called with the rows loaded so far."""
        asset = _checked_name(asset)
        key = SERVED_KEYS.get(asset)
        started = time.perf_counter()
        p = self.placeholder
        with self._transaction(exclusive=True) as cur:
            cur.execute(
                f"SELECT COALESCE(MAX(version), 0) FROM {REGISTRY} WHERE asset = {p}", (asset,)
            )
            version = int(cur.fetchone()[0]) + 1
            table = table_name(asset, version)
            columns = ", ".join(f'"{f.name}" {self._column_type(f.type)}' for f in rows.schema)
            cur.execute(f'CREATE TABLE "{table}" ({columns})')
            loaded = 0
            for batch in rows.to_batches(max_chunksize=self.batch_rows):
                values = [
                    self._to_python(f.type, batch.column(i).to_pylist())
                    for i, f in enumerate(rows.schema)
                ]
                self._insert_rows(cur, table, rows.column_names, list(zip(*values, strict=True)))
                loaded += batch.num_rows
                if on_batch is not None:
                    on_batch(loaded)
            if key is not None and key in rows.column_names:
                cur.execute(f'CREATE INDEX "{table}__{key}" ON "{table}" ("{key}")')
            seconds = time.perf_counter() - started
            cur.execute(
                f"INSERT INTO {REGISTRY} VALUES ({', '.join([p] * 14)})",
                (
                    asset, version, table, partition, commit, model_version,
                    json.dumps(checks or {}, sort_keys=True), rows.num_rows,
                    _schema_text(rows.schema),
                    dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                    seconds, 0, None, 0,
                ),
            )  # fmt: skip
        return self.version(asset, version)

    def make_current(self, asset: str, version: int) -> Version:
        """Points the readers' view ``<asset>`` at ``version`` in one transaction, then drops
        the versions beyond ``keep_versions``."""
        asset = _checked_name(asset)
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

    def publish(self, asset: str, rows: pa.Table, **record: Any) -> Version:
        """Loads ``rows`` as a new version and makes it current."""
        loaded = self.load(asset, rows, **record)
        return self.make_current(asset, loaded.version)

    def rollback(self, asset: str, date: str) -> Version:
        """Makes the version that was current before the current one current again, in one
        step; ``date`` must be the current version's partition."""
        asset = _checked_name(asset)
        with self._transaction(exclusive=True) as cur:
            current = self._current(cur, asset)
            if current is None:
                raise ServingError(f"{asset}: nothing is served, so there is nothing to roll back")
            if current.partition != date:
                raise ServingError(
                    f"{asset}: the current version v{current.version} serves {current.partition}, "
                    f"not {date}; nothing changed"
                )
            previous = self._previous(cur, asset, current.version)
            if previous is None:
                raise ServingError(
                    f"{asset}: no earlier version is kept to roll v{current.version} "
                    f"({current.partition}) back to; nothing changed"
                )
            self._point_view(cur, asset, previous)
            p = self.placeholder
            cur.execute(f"UPDATE {REGISTRY} SET is_current = 0 WHERE asset = {p}", (asset,))
            cur.execute(
                f"UPDATE {REGISTRY} SET is_current = 1 WHERE asset = {p} AND version = {p}",
                (asset, previous.version),
            )
        return self.version(asset, previous.version)

    def versions(self, asset: str, include_dropped: bool = False) -> list[Version]:
        """The asset's versions, newest first."""
        asset = _checked_name(asset)
        with self._transaction() as cur:
            found = self._rows(cur, asset)
        return [v for v in found if include_dropped or not v.dropped]

    def version(self, asset: str, version: int) -> Version:
        with self._transaction() as cur:
            found = self._row(cur, _checked_name(asset), version)
        if found is None:
            raise ServingError(f"{asset}: no version {version}")
        return found

    def current(self, asset: str) -> Version | None:
        with self._transaction() as cur:
            return self._current(cur, _checked_name(asset))

    def read_current(self, asset: str) -> pa.Table:
        """The rows readers see now, in the types they were published with."""
        asset = _checked_name(asset)
        with self._transaction() as cur:
            current = self._current(cur, asset)
            if current is None:
                raise ServingError(f"{asset}: nothing is served")
            p = self.placeholder
            cur.execute(
                f"SELECT arrow_schema FROM {REGISTRY} WHERE asset = {p} AND version = {p}",
                (asset, current.version),
            )
            schema = _schema_of(cur.fetchone()[0])
            cur.execute(f'SELECT * FROM "{asset}"')
            rows = cur.fetchall()
        columns = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
        return pa.table(
            [
                pa.array(self._from_python(f.type, list(values)), f.type)
                for f, values in zip(schema, columns, strict=True)
            ],
            schema=schema,
        )

    def drop_old(self, asset: str) -> list[int]:
        """Drops the versions beyond the newest ``keep_versions``, never the current one."""
        asset = _checked_name(asset)
        with self._transaction(exclusive=True) as cur:
            kept = [v for v in self._rows(cur, asset) if not v.dropped]
            beyond = [v for v in kept[self.keep_versions :] if not v.current]
            p = self.placeholder
            for old in beyond:
                cur.execute(f'DROP TABLE IF EXISTS "{old.table}"')
                cur.execute(
                    f"UPDATE {REGISTRY} SET dropped = 1 WHERE asset = {p} AND version = {p}",
                    (asset, old.version),
                )
        return [v.version for v in beyond]

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
