"""The Redis serving target: a lookup by key (``user_recommendations`` by ``user_id``), versions
as key prefixes and a pointer swapped in one command.

Version N of asset A is the hash ``<prefix>:A:v<N>``: one field per key value (the user id), its
value the JSON list of that key's rows, so a lookup is one ``HGET``. A version is loaded beside
the current one in pipelined batches and is complete only once its record is written to the
registry hash ``<prefix>:A:versions`` (last, by one script that also takes it out of the set of
loads under way); rows with vectors also get the list ``<prefix>:A:v<N>:ann``, their ANN
index, written before that record. It is made current by pointing ``<prefix>:A:current`` at N,
in one ``MULTI``/``EXEC`` with the record of what was current before (what a rollback goes back
to). A complete version's keys never change again until it is dropped.

A reader does ``GET <prefix>:A:current``, then ``HGET <prefix>:A:v<N> <key>``: it sees the old
day or the new one, never a mix. A load that is killed, or whose connection or store goes away,
has no registry record and is never made current; the next load cleans it up and takes the next
number. docs/serving.md, "Redis".
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
from pydantic import Field

from resources.serving.target import (
    Day,
    ServingError,
    ServingTarget,
    Version,
    ann_parts,
    schema_of,
    values_from_text,
    values_to_text,
)

# Deletes or extends the lock only while ``ARGV[1]`` holds it: a holder that lost it (it
# expired, another load took it over) must not release or extend the new holder's.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# Marks a load complete: its record is written, and it leaves the loading set, in one step and
# only while its loader still holds the lock (else another load may be cleaning it up).
_COMPLETE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('SREM', KEYS[2], ARGV[2]) == 0 then return 0 end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
return 1
"""


class RedisTarget(ServingTarget):
    """Serves each published day from Redis, one hash per version, looked up by key."""

    url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="The server: redis://[user:password@]host:port/db (rediss:// for TLS).",
    )
    prefix: str = Field(
        default="nightshift", description="The first part of every key this target writes."
    )
    # Two at least: a reader that read the pointer just before a swap then reads the version it
    # names, so the version a swap made not current must outlive the swap.
    keep_versions: int = Field(
        3, ge=2, description="Versions kept per asset, newest first; older ones are dropped."
    )
    connect_timeout_s: float = Field(
        default=10.0, description="How long a step waits for the server before it fails."
    )
    timeout_s: float = Field(default=60.0, description="How long one command may take.")
    lock_ttl_s: float = Field(
        default=30.0,
        description="How long a load's lock outlives its last batch, should its holder vanish "
        "without Redis closing its connection.",
    )
    lock_wait_s: float = Field(
        default=60.0, description="How long a load waits for another load to finish."
    )

    # ----- where, and what to do --------------------------------------------------------
    def address(self) -> str:
        try:
            parts = urlsplit(self.url)
            host = parts.hostname or ""
            port = f":{parts.port}" if parts.port else ""
        except ValueError:  # never echo what could hold a password
            return "redis://(unparseable url)"
        user = f"{parts.username}@" if parts.username else ""
        return f"{parts.scheme}://{user}{host}{port}{parts.path}"

    def fix(self) -> str:
        return (
            "start the server (redis-server) or point NIGHTSHIFT_SERVING_REDIS_URL at one that "
            "accepts connections, then re-run the step"
        )

    def key(self, asset: str, *parts: str) -> str:
        """``<prefix>:<asset>:<parts>``: every key of ``asset``."""
        return ":".join([self.prefix, asset, *parts])

    def data_key(self, asset: str, version: int) -> str:
        """The hash of version ``version``: key value -> the JSON list of its rows."""
        return self.key(asset, f"v{version}")

    # ----- connections ------------------------------------------------------------------
    def _session(self):
        return self._client()

    @contextmanager
    def _client(self) -> Iterator[Any]:
        """A client on one connection, which the lock names (its ``MULTI`` pipelines take a
        second one from its pool). No command is retried: a load whose connection drops fails
        rather than going on over a new connection the lock does not name."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        try:
            # A single-connection client connects here, at once.
            client = redis.Redis.from_url(
                self.url,
                decode_responses=True,
                single_connection_client=True,
                socket_connect_timeout=self.connect_timeout_s,
                socket_timeout=self.timeout_s,
                retry=Retry(NoBackoff(), 0),
            )
            client.ping()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise self._unreachable(exc) from exc
        try:
            yield client
        finally:
            client.close()

    @contextmanager
    def _locked(self, client, asset: str) -> Iterator[Callable[[], None]]:
        """Makes this the one operation changing ``asset``'s versions (readers never wait);
        yields a function that extends the lock, called between batches."""
        import redis

        lock, me = self.key(asset, "lock"), str(client.client_id())
        ttl_ms = max(1, int(self.lock_ttl_s * 1000))
        deadline = time.monotonic() + self.lock_wait_s
        while not client.set(lock, me, nx=True, px=ttl_ms):
            holder = client.get(lock)
            if holder is not None and not self._connected(client, holder):
                # The holder's connection is closed (its load was killed, its machine went
                # away): Redis runs nothing more from it, so its lock can be taken over.
                client.eval(_RELEASE, 1, lock, holder)
                continue
            if time.monotonic() > deadline:
                raise ServingError(
                    f"{asset}: another load at {self.address()} has held the lock for more than "
                    f"{self.lock_wait_s:g}s (client {holder}); nothing changed"
                )
            time.sleep(0.05)

        def renew() -> None:
            if not client.eval(_RENEW, 1, lock, me, ttl_ms):
                raise ServingError(f"{asset}: this load lost its lock at {self.address()}")

        try:
            yield renew
        finally:
            try:
                client.eval(_RELEASE, 1, lock, me)
            except redis.RedisError:  # the store went away: the lock goes with the connection
                pass

    @staticmethod
    def _connected(client, holder: str) -> bool:
        """Whether the connection ``holder`` names is still open (where the server refuses
        CLIENT LIST, as some managed ones do, assumed open: its lock then ends by expiring)."""
        import redis

        try:
            return bool(client.client_list(client_id=[holder]))
        except redis.ResponseError:
            return True

    # ----- the contract -----------------------------------------------------------------
    def _load(self, asset: str, rows: pa.Table, day: Day) -> Version:
        """Loads the version's keys in batches, its registry record last."""
        groups, order = self._grouped(asset, rows)
        ann = self.ann_payload(asset, rows)
        with self._client() as client, self._locked(client, asset) as renew:
            self._clean_incomplete(client, asset)
            version = int(client.incr(self.key(asset, "next")))
            client.sadd(self.key(asset, "loading"), version)
            data = self.data_key(asset, version)
            if order:
                client.rpush(f"{data}:order", *order)
            loaded, chunk, chunk_rows = 0, {}, 0
            fields = list(groups)
            for n, field in enumerate(fields):
                chunk[field] = groups[field]
                chunk_rows += groups[field][1]
                if chunk_rows >= self.batch_rows or n == len(fields) - 1:
                    client.hset(data, mapping={f: text for f, (text, _) in chunk.items()})
                    loaded += chunk_rows
                    chunk, chunk_rows = {}, 0
                    renew()
                    day.loaded(loaded)
            if ann is not None:
                # Before the record: a version is never complete without its index.
                for part in ann_parts(ann):
                    client.rpush(f"{data}:ann", base64.b64encode(part).decode())
                    renew()
            record = {**day.record(rows), "previous": None, "dropped": False}
            keys = [
                self.key(asset, "lock"),
                self.key(asset, "loading"),
                self.key(asset, "versions"),
            ]
            me = str(client.client_id())
            if not client.eval(_COMPLETE, 3, *keys, me, version, json.dumps(record)):
                raise ServingError(
                    f"{asset}: v{version} lost its lock at {self.address()} before it was "
                    "complete; it is not served and the next load cleans it up"
                )
            return self._version(asset, version, record, current=self._pointer(client, asset))

    def make_current(self, asset: str, version: int) -> Version:
        """Points ``<prefix>:<asset>:current`` at ``version`` in one step, then drops the
        versions beyond ``keep_versions``."""
        asset = self._checked(asset)
        with self._client() as client, self._locked(client, asset):
            record = self._stored(client, asset, version)
            if record is None or record["dropped"]:
                raise ServingError(f"{asset}: no version {version} to make current")
            before = self._pointer(client, asset)
            swap = client.pipeline(transaction=True)
            swap.set(self.key(asset, "current"), version)
            if before is not None and before != version:
                # What a rollback of this version goes back to.
                record["previous"] = before
                swap.hset(self.key(asset, "versions"), str(version), json.dumps(record))
            swap.execute()
        self.drop_old(asset)
        return self.version(asset, version)

    def rollback(self, asset: str, date: str) -> Version:
        asset = self._checked(asset)
        with self._client() as client, self._locked(client, asset):
            previous = self._rollback_to(
                asset,
                date,
                self._current(client, asset),
                lambda version: self._row(client, asset, self._previous(client, asset, version)),
            )
            client.set(self.key(asset, "current"), previous.version)
        return self.version(asset, previous.version)

    def _read(self, client, current: Version) -> pa.Table:
        asset, number = current.asset, current.version
        # One snapshot of the version: a drop deletes its keys and marks its record in one step,
        # so this sees all of it or its record marked dropped.
        read = client.pipeline(transaction=True)
        read.hget(self.key(asset, "versions"), str(number))
        read.lrange(f"{current.table}:order", 0, -1)
        read.hgetall(current.table)
        text, order, groups = read.execute()
        record = json.loads(text)
        if record["dropped"]:
            raise ServingError(f"{asset}: v{number} was dropped while it was read; read again")
        schema = schema_of(record["arrow_schema"])
        pending = {field: iter(json.loads(value)) for field, value in groups.items()}
        found = [next(pending[field]) for piece in order for field in json.loads(piece)]
        return pa.table(
            [
                pa.array(values_from_text(f.type, [r[f.name] for r in found]), f.type)
                for f in schema
            ],
            schema=schema,
        )

    def _ann_bytes(self, client, current: Version) -> bytes | None:
        # One snapshot, as ``_read``: the index, or the version's record marked dropped.
        read = client.pipeline(transaction=True)
        read.hget(self.key(current.asset, "versions"), str(current.version))
        read.lrange(f"{current.table}:ann", 0, -1)
        text, parts = read.execute()
        if json.loads(text)["dropped"]:
            raise ServingError(
                f"{current.asset}: v{current.version} was dropped while it was read; read again"
            )
        return b"".join(base64.b64decode(part) for part in parts) if parts else None

    def drop_old(self, asset: str) -> list[int]:
        asset = self._checked(asset)
        with self._client() as client, self._locked(client, asset):
            beyond = self._beyond_kept(self._rows(client, asset))
            for old in beyond:
                record = self._stored(client, asset, old.version)
                record["dropped"] = True
                drop = client.pipeline(transaction=True)
                drop.delete(old.table, f"{old.table}:order", f"{old.table}:ann")
                drop.hset(self.key(asset, "versions"), str(old.version), json.dumps(record))
                drop.execute()
        return [v.version for v in beyond]

    # ----- helpers ----------------------------------------------------------------------
    def _grouped(self, asset: str, rows: pa.Table) -> tuple[dict[str, tuple[str, int]], list]:
        """Each key value's rows as the JSON text its field holds, with how many there are, in
        the order keys first appear; and each row's key, as JSON lists of ``batch_rows``,
        which put the rows back in their published order."""
        key = self.key_column(asset, rows)
        names = rows.column_names
        grouped: dict[str, list[dict]] = {}
        order: list[str] = []
        offset = 0
        for batch in rows.to_batches(max_chunksize=self.batch_rows):
            values = [
                values_to_text(f.type, batch.column(i).to_pylist())
                for i, f in enumerate(rows.schema)
            ]
            if key is not None:
                fields = ["" if v is None else str(v) for v in batch.column(key).to_pylist()]
            else:  # an asset looked up by nothing: by row number
                fields = [str(offset + n) for n in range(batch.num_rows)]
            for field, row in zip(fields, zip(*values, strict=True), strict=True):
                grouped.setdefault(field, []).append(dict(zip(names, row, strict=True)))
            order.append(json.dumps(fields))
            offset += batch.num_rows
        return {f: (json.dumps(r), len(r)) for f, r in grouped.items()}, order

    def _clean_incomplete(self, client, asset: str) -> None:
        """Deletes what loads that never completed left (killed, or their store went away);
        only called under the lock, so none of them is still loading."""
        loading = self.key(asset, "loading")
        for number in client.smembers(loading):
            data = self.data_key(asset, int(number))
            clean = client.pipeline(transaction=True)
            clean.delete(data, f"{data}:order", f"{data}:ann")
            clean.srem(loading, number)
            clean.execute()

    def _pointer(self, client, asset: str) -> int | None:
        found = client.get(self.key(asset, "current"))
        return None if found is None else int(found)

    def _stored(self, client, asset: str, version: int) -> dict | None:
        found = client.hget(self.key(asset, "versions"), str(version))
        return None if found is None else json.loads(found)

    def _row(self, client, asset: str, version: int | None) -> Version | None:
        """Version ``version`` as the registry has it, if any."""
        record = None if version is None else self._stored(client, asset, version)
        if record is None:
            return None
        return self._version(asset, version, record, self._pointer(client, asset))

    def _current(self, client, asset: str) -> Version | None:
        return self._row(client, asset, self._pointer(client, asset))

    def _previous(self, client, asset: str, version: int) -> int | None:
        """The version current before ``version`` was made current."""
        record = self._stored(client, asset, version)
        return None if record is None else record["previous"]

    def _rows(self, client, asset: str) -> list[Version]:
        current = self._pointer(client, asset)
        records = client.hgetall(self.key(asset, "versions"))
        found = [self._version(asset, int(n), json.loads(r), current) for n, r in records.items()]
        return sorted(found, key=lambda v: v.version, reverse=True)

    def _version(self, asset: str, version: int, record: dict, current: int | None) -> Version:
        return Version(
            asset=asset,
            version=version,
            table=self.data_key(asset, version),
            partition=record["partition"],
            commit=record["commit"],
            model_version=record["model_version"],
            checks=record["checks"],
            rows=int(record["rows"]),
            loaded_at=record["loaded_at"],
            load_seconds=float(record["load_seconds"]),
            current=version == current,
            dropped=bool(record["dropped"]),
        )
