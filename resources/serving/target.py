"""The contract every serving target keeps, whatever the store.

A published day is served as a new *version* of its asset, loaded beside the current one and
complete (with its registry record: partition, commit, model version, checks, rows, Arrow
schema) before anything points at it; then it is made current in one step, so a reader sees the
old version or the new one, never a mix. A load that is killed or loses its store never becomes
current. ``rollback`` makes the version current before the current one current again, in one
step; versions beyond ``keep_versions`` are dropped, never the current one.

SQL stores implement it once (``resources/serving/sql.py``); Redis keeps it with key prefixes
and a pointer (``resources/serving/redis.py``).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import re
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from dagster import ConfigurableResource
from pydantic import Field

# The column each served asset is looked up by: every version is indexed (SQL) or keyed (Redis)
# on it.
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
class Day:
    """What ``load`` is told of the day it loads, and when it started."""

    partition: str
    commit: str
    model_version: str
    checks: dict[str, Any]
    on_batch: Callable[[int], None] | None
    started: float

    def loaded(self, rows: int) -> None:
        """Says how many rows are loaded so far."""
        if self.on_batch is not None:
            self.on_batch(rows)

    def record(self, rows: pa.Table) -> dict[str, Any]:
        """The loaded version's registry record: the day's, with the rows, their Arrow schema
        (to give them back in the types they were published with) and the load's time."""
        return {
            "partition": self.partition,
            "commit": self.commit,
            "model_version": self.model_version,
            "checks": self.checks,
            "rows": rows.num_rows,
            "arrow_schema": _schema_text(rows.schema),
            "loaded_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "load_seconds": time.perf_counter() - self.started,
        }


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


def _checked_name(asset: str) -> str:
    if not _NAME.match(asset):
        raise ServingError(f"not a servable asset name: {asset!r} (lower case, digits and _)")
    return asset


def _schema_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _schema_of(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def _to_text(kind: pa.DataType, values: list) -> list:
    """A column's values for a store that keeps text and plain numbers (SQLite, JSON): times as
    ISO text, exact decimals as their text; ``_from_text`` turns them back."""
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_time(kind):
        return [None if v is None else v.isoformat() for v in values]
    if pa.types.is_decimal(kind):
        return [None if v is None else str(v) for v in values]
    return values


def _from_text(kind: pa.DataType, values: list) -> list:
    if pa.types.is_timestamp(kind):
        return [None if v is None else dt.datetime.fromisoformat(v) for v in values]
    if pa.types.is_date(kind):
        return [None if v is None else dt.date.fromisoformat(v) for v in values]
    if pa.types.is_time(kind):
        return [None if v is None else dt.time.fromisoformat(v) for v in values]
    if pa.types.is_decimal(kind):
        return [None if v is None else decimal.Decimal(v) for v in values]
    if pa.types.is_boolean(kind):
        return [None if v is None else bool(v) for v in values]
    return values


class ServingTarget(ConfigurableResource):
    """Where published days are served from: the contract the publish assets and
    `nightshift serving` use; a subclass is one kind of store."""

    keep_versions: int = Field(
        3, ge=1, description="Versions kept per asset, newest first; older ones are dropped."
    )  # the current version is never dropped, however old
    batch_rows: int = Field(
        default=10_000, ge=1, description="Rows written per statement while a version loads."
    )

    def address(self) -> str:
        """Where the store is, for messages (never with a password)."""
        raise NotImplementedError

    def fix(self) -> str:
        """What to do when the store cannot be reached."""
        raise NotImplementedError

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
        """Loads ``rows`` as a new version of ``asset`` (not yet current), complete with its
        registry record or not at all. ``on_batch`` is called with the rows loaded so far."""
        day = Day(partition, commit, model_version, checks or {}, on_batch, time.perf_counter())
        return self._load(_checked_name(asset), rows, day)

    def make_current(self, asset: str, version: int) -> Version:
        """Makes ``version`` the one readers see, in one step, then drops the versions beyond
        ``keep_versions``."""
        raise NotImplementedError

    def publish(self, asset: str, rows: pa.Table, **record: Any) -> Version:
        """Loads ``rows`` as a new version and makes it current."""
        loaded = self.load(asset, rows, **record)
        return self.make_current(asset, loaded.version)

    def rollback(self, asset: str, date: str) -> Version:
        """Makes the version that was current before the current one current again, in one
        step; ``date`` must be the current version's partition."""
        raise NotImplementedError

    def versions(self, asset: str, include_dropped: bool = False) -> list[Version]:
        """The asset's versions, newest first."""
        with self._session() as session:
            found = self._rows(session, _checked_name(asset))
        return [v for v in found if include_dropped or not v.dropped]

    def version(self, asset: str, version: int) -> Version:
        with self._session() as session:
            found = self._row(session, _checked_name(asset), version)
        if found is None:
            raise ServingError(f"{asset}: no version {version}")
        return found

    def current(self, asset: str) -> Version | None:
        with self._session() as session:
            return self._current(session, _checked_name(asset))

    def read_current(self, asset: str) -> pa.Table:
        """The rows readers see now, in the order and types they were published with."""
        asset = _checked_name(asset)
        with self._session() as session:
            current = self._current(session, asset)
            if current is None:
                raise ServingError(f"{asset}: nothing is served")
            return self._read(session, current)

    def drop_old(self, asset: str) -> list[int]:
        """Drops the versions beyond the newest ``keep_versions``, never the current one."""
        raise NotImplementedError

    # ----- what a store provides ----------------------------------------------------------
    def _load(self, asset: str, rows: pa.Table, day: Day) -> Version:
        """Loads the version ``load`` asks for; ``day.record(rows)`` is its registry record."""
        raise NotImplementedError

    def _session(self) -> AbstractContextManager[Any]:
        """A connection to read the registry through (raises ``ServingUnavailable``)."""
        raise NotImplementedError

    def _rows(self, session, asset: str) -> list[Version]:
        """Every version of ``asset`` the registry has, dropped ones too, newest first."""
        raise NotImplementedError

    def _row(self, session, asset: str, version: int) -> Version | None:
        raise NotImplementedError

    def _current(self, session, asset: str) -> Version | None:
        raise NotImplementedError

    def _read(self, session, current: Version) -> pa.Table:
        """The rows of ``current``, as readers see them."""
        raise NotImplementedError

    # ----- what every store decides the same way -----------------------------------------
    _checked = staticmethod(_checked_name)

    def _unreachable(self, cause: BaseException) -> ServingUnavailable:
        """The error of a store that cannot be reached, with its address and the fix."""
        return ServingUnavailable(self.address(), self.fix(), cause)

    @staticmethod
    def key_column(asset: str, rows: pa.Table) -> str | None:
        """The column ``asset``'s versions are looked up by, when ``rows`` has it."""
        key = SERVED_KEYS.get(asset)
        return key if key in rows.column_names else None

    def _beyond_kept(self, versions: list[Version]) -> list[Version]:
        """Of ``versions`` (newest first), those ``drop_old`` drops."""
        kept = [v for v in versions if not v.dropped]
        return [v for v in kept[self.keep_versions :] if not v.current]

    @staticmethod
    def _rollback_to(
        asset: str,
        date: str,
        current: Version | None,
        previous_of: Callable[[int], Version | None],
    ) -> Version:
        """The version a rollback of ``asset`` from ``date`` makes current (``previous_of``
        gives the version current before one, if still kept), or why nothing changes."""
        if current is None:
            raise ServingError(f"{asset}: nothing is served, so there is nothing to roll back")
        if current.partition != date:
            raise ServingError(
                f"{asset}: the current version v{current.version} serves {current.partition}, "
                f"not {date}; nothing changed"
            )
        previous = previous_of(current.version)
        if previous is None or previous.dropped:
            raise ServingError(
                f"{asset}: no earlier version is kept to roll v{current.version} "
                f"({current.partition}) back to; nothing changed"
            )
        return previous
