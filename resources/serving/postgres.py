"""The PostgreSQL serving target: the same versions and view swap, on a server the product
already queries."""

from __future__ import annotations

from typing import ClassVar

import pyarrow as pa
from pydantic import Field

from resources.serving.sql import REGISTRY, SqlTarget


class PostgresTarget(SqlTarget):
    """Serves each published day from a PostgreSQL database."""

    dsn: str | None = Field(
        default=None,
        description="A libpq connection string or URI; when set, the fields below are ignored.",
    )
    host: str = Field(default="127.0.0.1")
    port: int = Field(default=5432)
    dbname: str = Field(default="postgres")
    user: str = Field(default="postgres")
    password: str | None = Field(default=None)
    connect_timeout_s: int = Field(
        default=10, description="How long a step waits for the server before it fails."
    )

    placeholder: ClassVar[str] = "%s"
    blob_type: ClassVar[str] = "BYTEA"

    def _parameters(self) -> dict:
        from psycopg2.extensions import parse_dsn

        if self.dsn:
            return parse_dsn(self.dsn)
        found = {"host": self.host, "port": str(self.port), "dbname": self.dbname}
        found["user"] = self.user
        if self.password:
            found["password"] = self.password
        return found

    def address(self) -> str:
        try:
            given = self._parameters()
        except Exception:  # an unparseable DSN: say so, never echo a password
            return "postgresql://(unparseable dsn)"
        user = f"{given['user']}@" if given.get("user") else ""
        port = f":{given['port']}" if given.get("port") else ""
        return (
            f"postgresql://{user}{given.get('host', 'localhost')}{port}/{given.get('dbname', '')}"
        )

    def fix(self) -> str:
        return (
            "start the server or point NIGHTSHIFT_SERVING_DSN at one that accepts connections, "
            "then re-run the step"
        )

    def _connect(self):
        import psycopg2

        return psycopg2.connect(connect_timeout=self.connect_timeout_s, **self._parameters())

    def _ensure_registry(self, cursor) -> None:
        cursor.execute("SELECT to_regclass(%s)", (REGISTRY,))
        if cursor.fetchone()[0] is not None:
            return
        # Two first loads at once would both create it: CREATE TABLE IF NOT EXISTS is not safe
        # against a concurrent create in PostgreSQL (a unique violation in its catalog), so the
        # first creation is one transaction at a time.
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"nightshift:{REGISTRY}",))
        super()._ensure_registry(cursor)

    def _lock(self, cursor) -> None:
        # Conflicts with itself and with writers, not with plain SELECTs.
        cursor.execute(f"LOCK TABLE {REGISTRY} IN SHARE ROW EXCLUSIVE MODE")

    def _insert_rows(self, cursor, table, columns, rows) -> None:
        from psycopg2.extras import execute_values

        execute_values(cursor, f'INSERT INTO "{table}" VALUES %s', rows, page_size=len(rows) or 1)

    def _column_type(self, kind: pa.DataType) -> str:
        if pa.types.is_boolean(kind):
            return "BOOLEAN"
        if pa.types.is_int8(kind) or pa.types.is_int16(kind) or pa.types.is_uint8(kind):
            return "SMALLINT"
        if pa.types.is_int32(kind) or pa.types.is_uint16(kind):
            return "INTEGER"
        if pa.types.is_integer(kind):
            return "BIGINT"
        if pa.types.is_float32(kind) or pa.types.is_float16(kind):
            return "REAL"
        if pa.types.is_floating(kind):
            return "DOUBLE PRECISION"
        if pa.types.is_timestamp(kind):
            return "TIMESTAMPTZ" if kind.tz else "TIMESTAMP"
        if pa.types.is_date(kind):
            return "DATE"
        if pa.types.is_decimal(kind):
            return f"NUMERIC({kind.precision}, {kind.scale})"
        return "TEXT"
