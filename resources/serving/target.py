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
import json
import re
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from dagster import ConfigurableResource
from pydantic import Field

# The column each served asset is looked up by: every version is indexed (SQL) or keyed (Redis)
# on it.
SERVED_KEYS: dict[str, str] = {
    "user_recommendations": "user_id",
    "fraud_alerts": "transaction_id",
    "document_embeddings": "doc_id",
}
# A served asset with this column (a list of floats per row) is searchable by cosine: each of
# its versions carries an ANN index over the column, loaded and dropped with the version.
VECTOR_COLUMN = "embedding"
# Index bytes are stored in parts, so that no single value nears a store's value limit.
ANN_PART_BYTES = 16 * 1024 * 1024

# How many times a read follows the current version when a swap drops the one it was reading.
READ_TRIES = 5

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
            "arrow_schema": schema_text(rows.schema),
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


def schema_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_of(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def is_vector_type(kind: pa.DataType) -> bool:
    """A list (fixed size or not) of floats: stored as the bytes of its values."""
    return (pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind)) and pa.types.is_floating(
        kind.value_type
    )


def vectors_to_bytes(kind: pa.DataType, values: list) -> list:
    """Each row's vector as the bytes of its values in their published float type."""
    dtype = kind.value_type.to_pandas_dtype()
    return [None if v is None else np.asarray(v, dtype=dtype).tobytes() for v in values]


def vectors_from_bytes(kind: pa.DataType, values: list) -> list:
    dtype = kind.value_type.to_pandas_dtype()
    return [None if v is None else np.frombuffer(bytes(v), dtype=dtype).tolist() for v in values]


@dataclass(frozen=True)
class Ann:
    """A version's ANN index, deserialized, with the key of each of its ids and its vectors."""

    index: Any
    keys: list
    vectors: np.ndarray

    def search(self, query: np.ndarray, k: int) -> list[tuple[Any, float]]:
        scores, ids = self.index.search(query, min(k, len(self.keys)))
        return [(self.keys[i], float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]

    def search_exact(self, query: np.ndarray, k: int) -> list[tuple[Any, float]]:
        scores = self.vectors @ query[0]
        k = min(k, len(self.keys))
        best = np.argpartition(-scores, k - 1)[:k] if k else np.array([], dtype=int)
        best = best[np.argsort(-scores[best], kind="stable")]
        return [(self.keys[i], float(scores[i])) for i in best]


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """``matrix`` as float32 rows of unit length, so that inner product is cosine."""
    import faiss

    # A copy: faiss scales in place, and the caller's vectors (or Arrow's buffers) stay as given.
    rows = np.array(matrix, dtype=np.float32, order="C", copy=True)
    faiss.normalize_L2(rows)
    return rows


def ann_parts(payload: bytes) -> list[bytes]:
    return [payload[i : i + ANN_PART_BYTES] for i in range(0, len(payload), ANN_PART_BYTES)]


def _ann_payload(index_bytes: bytes, keys: list) -> bytes:
    """The keys (JSON) and the serialized index as one value: the keys' length, then both."""
    head = json.dumps(keys).encode()
    return len(head).to_bytes(8, "little") + head + index_bytes


def _ann_of(payload: bytes) -> Ann:
    import faiss

    size = int.from_bytes(payload[:8], "little")
    keys = json.loads(payload[8 : 8 + size])
    index = faiss.deserialize_index(np.frombuffer(payload[8 + size :], dtype=np.uint8))
    vectors = index.reconstruct_n(0, index.ntotal) if index.ntotal else np.zeros((0, index.d))
    return Ann(index, keys, np.asarray(vectors, dtype=np.float32))


# Deserialized indexes by (store address, asset, version): a version's index never changes
# once it is complete, so a process deserializes each once.
_ANN_CACHE: dict[tuple[str, str, int], Ann] = {}


def values_to_text(kind: pa.DataType, values: list) -> list:
    """A column's values for a store that keeps text and plain numbers (SQLite, JSON): times as
    ISO text, exact decimals as their text; ``values_from_text`` turns them back."""
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_time(kind):
        return [None if v is None else v.isoformat() for v in values]
    if pa.types.is_decimal(kind):
        return [None if v is None else str(v) for v in values]
    return values


def values_from_text(kind: pa.DataType, values: list) -> list:
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
    hnsw_m: int = Field(
        default=32, ge=2, description="Links per vector in a version's HNSW index (its M)."
    )
    ef_construction: int = Field(
        default=80, ge=1, description="Candidates kept while the HNSW index is built."
    )
    ef_search: int = Field(
        default=128,
        ge=1,
        description="Candidates kept while `search` walks the index: higher finds more of the "
        "exact neighbours, more slowly.",
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
        return self._on_current(_checked_name(asset), self._read)

    def _on_current(self, asset: str, read: Callable[[Any, Version], Any]) -> Any:
        """``read(session, current)`` on the version current now.

        Finding the current version and reading it are two statements: in between, a load on
        another connection can make a newer version current and drop this one (PostgreSQL
        reads each statement at its own snapshot; ``keep_versions=1`` drops at once). A read
        that fails on a version no longer current is done again on the one that is.
        """
        for _ in range(READ_TRIES):
            current: Version | None = None
            try:
                with self._session() as session:
                    current = self._current(session, asset)
                    if current is None:
                        raise ServingError(f"{asset}: nothing is served")
                    return read(session, current)
            except ServingError:
                raise
            except Exception:
                now = self.current(asset)
                if current is None or now is None or now.version == current.version:
                    raise
        raise ServingError(
            f"{asset}: the current version changed under {READ_TRIES} reads in a row; "
            "loads are swapping faster than a read completes"
        )

    def drop_old(self, asset: str) -> list[int]:
        """Drops the versions beyond the newest ``keep_versions``, never the current one."""
        raise NotImplementedError

    def search(self, asset: str, vector, k: int = 10) -> list[tuple[Any, float]]:
        """The ``k`` rows of the current version nearest ``vector`` by cosine, best first, as
        (key, cosine), through the version's ANN index (approximate: see ``ef_search``)."""
        ann, query = self._ann_and_query(asset, vector)
        ann.index.hnsw.efSearch = max(self.ef_search, k)
        return ann.search(query, k)

    def search_exact(self, asset: str, vector, k: int = 10) -> list[tuple[Any, float]]:
        """As ``search``, by comparing ``vector`` with every vector of the current version."""
        ann, query = self._ann_and_query(asset, vector)
        return ann.search_exact(query, k)

    def ann_payload(self, asset: str, rows: pa.Table) -> bytes | None:
        """The version's index over its ``VECTOR_COLUMN`` with each id's key, as bytes stored
        with the version; None for rows without vectors."""
        import faiss

        if VECTOR_COLUMN not in rows.column_names or not is_vector_type(
            rows.schema.field(VECTOR_COLUMN).type
        ):
            return None
        column = rows[VECTOR_COLUMN]
        if column.null_count:
            raise ServingError(f"{asset}: {column.null_count} rows have no {VECTOR_COLUMN}")
        width = len(column[0]) if len(column) else 0
        flat = pa.concat_arrays([c.flatten() for c in column.chunks]) if len(column) else []
        matrix = unit_rows(np.asarray(flat, dtype=np.float32).reshape(len(column), width))
        index = faiss.IndexHNSWFlat(max(width, 1), self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = self.ef_construction
        if len(matrix):
            index.add(matrix)
        key = self.key_column(asset, rows)
        keys = rows[key].to_pylist() if key is not None else list(range(rows.num_rows))
        return _ann_payload(faiss.serialize_index(index).tobytes(), keys)

    def _ann_and_query(self, asset: str, vector) -> tuple[Ann, np.ndarray]:
        asset = _checked_name(asset)

        def index_of(session, current: Version) -> Ann:
            found = (self.address(), asset, current.version, current.loaded_at)
            found += (current.load_seconds,)
            ann = _ANN_CACHE.get(found)
            if ann is None:
                payload = self._ann_bytes(session, current)
                if payload is None:
                    raise ServingError(
                        f"{asset}: v{current.version} has no {VECTOR_COLUMN} column to search"
                    )
                ann = _ann_of(payload)
                # Only the current version's index is kept: a swap makes the older one unused.
                for old in [c for c in _ANN_CACHE if c[:2] == found[:2]]:
                    del _ANN_CACHE[old]
                _ANN_CACHE[found] = ann
            return ann

        ann = self._on_current(asset, index_of)
        query = unit_rows(np.asarray(vector, dtype=np.float32).reshape(1, -1))
        if query.shape[1] != ann.index.d:
            raise ServingError(
                f"{asset}: a query of {query.shape[1]} dimensions against vectors of {ann.index.d}"
            )
        return ann, query

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

    def _ann_bytes(self, session, current: Version) -> bytes | None:
        """The ANN payload stored with ``current`` (``ann_payload``), None if it has none."""
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
