"""The embedded serving target: one SQLite file, no server. WAL mode lets other processes read
the served views while a version loads."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow as pa
from pydantic import Field

from resources.serving.sql import SqlTarget
from resources.serving.target import values_from_text, values_to_text
from resources.storage import default_data_root


def default_sqlite_path() -> str:
    """``<data root>/serving/serving.sqlite``: beside the outputs it serves."""
    root = default_data_root()
    if "://" in root:
        raise ValueError(
            f"the data root {root} is not a local folder, so the embedded serving store has no "
            "default place: set NIGHTSHIFT_SERVING_PATH, or NIGHTSHIFT_SERVING=postgres"
        )
    return str(Path(root) / "serving" / "serving.sqlite")


class SqliteTarget(SqlTarget):
    """Serves each published day from a SQLite file (the default: needs no server)."""

    path: str | None = Field(
        default=None,
        description="The SQLite file; default <data root>/serving/serving.sqlite.",
    )
    busy_timeout_s: float = Field(
        default=60.0, description="How long a load waits for another load to finish."
    )

    def file(self) -> Path:
        return Path(self.path or default_sqlite_path())

    def address(self) -> str:
        return f"sqlite:///{self.file()}"

    def fix(self) -> str:
        return f"check that {self.file().parent} exists and is writable, or set another path"

    def _connect(self):
        self.file().parent.mkdir(parents=True, exist_ok=True)
        # Transactions are begun here explicitly, so that DDL is inside them too.
        connection = sqlite3.connect(self.file(), timeout=self.busy_timeout_s, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        return connection

    def _begin(self, cursor, exclusive: bool) -> None:
        # IMMEDIATE takes the write lock up front: two loads never pick the same version.
        cursor.execute("BEGIN IMMEDIATE" if exclusive else "BEGIN")

    def _column_type(self, kind: pa.DataType) -> str:
        if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
            return "INTEGER"
        if pa.types.is_floating(kind):
            return "REAL"
        return "TEXT"

    def _to_python(self, kind: pa.DataType, values: list) -> list:
        return values_to_text(kind, values)

    def _from_python(self, kind: pa.DataType, values: list) -> list:
        return values_from_text(kind, values)
