"""Partition leases: one writer per output partition at a time, on a local disk or on S3.

A lease is a small JSON object next to the partition's staging area, taken with an exclusive
create and renewed or taken over with a compare-and-swap: on S3 through conditional writes
(``If-None-Match: *`` / ``If-Match: <etag>``), locally through the same operations under an
``flock``. A lease whose holder stopped renewing it (its node vanished) expires and can be taken
over; a retry of the same run lineage takes it over at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from inference.engine.diskspace import writing


class PartitionLeasedError(RuntimeError):
    """Another live run holds the partition: two writers never share a staging area."""


class CasStore(Protocol):
    """Compare-and-swap on small objects; a token identifies the version that was read."""

    def read(self, path: str) -> tuple[dict[str, Any], str] | None: ...
    def create(self, path: str, data: dict[str, Any]) -> str | None: ...
    def replace(self, path: str, data: dict[str, Any], token: str) -> str | None: ...
    def delete(self, path: str, token: str) -> bool: ...


class LocalCasStore:
    """Compare-and-swap on local files, made atomic with an exclusive ``flock``."""

    def _locked(self, path: str):
        lock_path = Path(f"{path}.lock")
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a+")  # noqa: SIM115 - closed by _Unlock
        fcntl.flock(handle, fcntl.LOCK_EX)
        return _Unlock(handle)

    @staticmethod
    def _token(raw: bytes) -> str:
        return hashlib.sha256(raw).hexdigest()

    def _read_raw(self, path: str) -> bytes | None:
        try:
            return Path(path).read_bytes()
        except FileNotFoundError:
            return None

    def _write(self, path: str, data: dict[str, Any]) -> str:
        raw = json.dumps(data, sort_keys=True).encode()
        tmp = f"{path}.tmp-{os.getpid()}"
        with writing(path, cleanup=lambda: Path(tmp).unlink(missing_ok=True)):
            with open(tmp, "wb") as out:
                out.write(raw)
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, path)
        return self._token(raw)

    def read(self, path: str) -> tuple[dict[str, Any], str] | None:
        with self._locked(path):
            raw = self._read_raw(path)
        return None if raw is None else (json.loads(raw), self._token(raw))

    def create(self, path: str, data: dict[str, Any]) -> str | None:
        with self._locked(path):
            if self._read_raw(path) is not None:
                return None
            return self._write(path, data)

    def replace(self, path: str, data: dict[str, Any], token: str) -> str | None:
        with self._locked(path):
            raw = self._read_raw(path)
            if raw is None or self._token(raw) != token:
                return None
            return self._write(path, data)

    def delete(self, path: str, token: str) -> bool:
        with self._locked(path):
            raw = self._read_raw(path)
            if raw is None or self._token(raw) != token:
                return False
            os.remove(path)
            return True


class _Unlock:
    def __init__(self, handle):
        self.handle = handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


class S3CasStore:
    """Compare-and-swap on S3 objects with conditional writes (ETags as tokens)."""

    def __init__(self, client):
        self.client = client

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        bucket, _, key = path.partition("/")
        return bucket, key

    def _failed_precondition(self, exc: Exception) -> bool:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        return code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "NoSuchKey")

    def read(self, path: str) -> tuple[dict[str, Any], str] | None:
        bucket, key = self._split(path)
        try:
            got = self.client.get_object(Bucket=bucket, Key=key)
        except self.client.exceptions.NoSuchKey:
            return None
        return json.loads(got["Body"].read()), got["ETag"]

    def _put(self, path: str, data: dict[str, Any], **condition) -> str | None:
        bucket, key = self._split(path)
        body = json.dumps(data, sort_keys=True).encode()
        try:
            return self.client.put_object(Bucket=bucket, Key=key, Body=body, **condition)["ETag"]
        except Exception as exc:
            if self._failed_precondition(exc):
                return None
            raise

    def create(self, path: str, data: dict[str, Any]) -> str | None:
        return self._put(path, data, IfNoneMatch="*")

    def replace(self, path: str, data: dict[str, Any], token: str) -> str | None:
        return self._put(path, data, IfMatch=token)

    def delete(self, path: str, token: str) -> bool:
        current = self.read(path)
        if current is None or current[1] != token:
            return False
        bucket, key = self._split(path)
        self.client.delete_object(Bucket=bucket, Key=key)
        return True


@dataclass
class Lease:
    """A held lease; ``renew`` before it expires, ``release`` when done."""

    store: CasStore
    path: str
    holder: dict[str, Any]
    token: str
    seconds: float

    def renew(self) -> None:
        data = {**self.holder, "expires": time.time() + self.seconds}
        token = self.store.replace(self.path, data, self.token)
        if token is None:
            raise PartitionLeasedError(f"lost the lease {self.path}: another run took it over")
        self.holder, self.token = data, token

    def release(self) -> None:
        self.store.delete(self.path, self.token)


def acquire_lease(store: CasStore, path: str, lineage: str, seconds: float = 600.0) -> Lease:
    """Takes the partition's lease, or takes over one that is stale or held by our own lineage.

    Args:
        store: where the lease lives.
        path: the lease object's path.
        lineage: the run lineage (Dagster's root run id): a retry of the same run may take over
            the lease its killed predecessor left behind without waiting for it to expire.
        seconds: how long the lease lasts without renewal.

    Raises:
        PartitionLeasedError: another live run of another lineage holds it.
    """
    holder = {"lineage": lineage, "host": socket.gethostname(), "pid": os.getpid()}
    for _ in range(5):
        data = {**holder, "expires": time.time() + seconds}
        token = store.create(path, data)
        if token is not None:
            return Lease(store, path, data, token, seconds)
        current = store.read(path)
        if current is None:
            continue
        existing, existing_token = current
        if not _can_take_over(existing, lineage):
            raise PartitionLeasedError(
                f"partition is being written by lineage {existing.get('lineage')} on host "
                f"{existing.get('host')} (pid {existing.get('pid')}) until "
                f"{time.strftime('%H:%M:%S', time.gmtime(existing.get('expires', 0)))} UTC: {path}"
            )
        token = store.replace(path, data, existing_token)
        if token is not None:
            return Lease(store, path, data, token, seconds)
    raise PartitionLeasedError(f"could not take the lease {path}: it keeps changing hands")


def _can_take_over(existing: dict[str, Any], lineage: str) -> bool:
    if existing.get("lineage") == lineage or existing.get("expires", 0) < time.time():
        return True
    # Same machine and the holder's process is gone: it was killed, not merely slow.
    pid = existing.get("pid")
    if existing.get("host") == socket.gethostname() and isinstance(pid, int) and pid > 0:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return False
