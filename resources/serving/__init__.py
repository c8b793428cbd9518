"""Serving targets: where each night's published days are served to the product.

``serving_from_env`` picks one by setting (``NIGHTSHIFT_SERVING``): the embedded SQLite file
under the data root by default, PostgreSQL with ``NIGHTSHIFT_SERVING=postgres``, Redis (a lookup by
key) with ``NIGHTSHIFT_SERVING=redis``.
"""

from __future__ import annotations

import os

from resources.serving.postgres import PostgresTarget
from resources.serving.redis import RedisTarget
from resources.serving.sql import REGISTRY, SqlTarget, table_name
from resources.serving.sqlite import SqliteTarget, default_sqlite_path
from resources.serving.target import (
    SERVED_KEYS,
    ServingError,
    ServingTarget,
    ServingUnavailable,
    Version,
)

__all__ = [
    "REGISTRY",
    "SERVED_KEYS",
    "PostgresTarget",
    "RedisTarget",
    "ServingError",
    "ServingTarget",
    "ServingUnavailable",
    "SqlTarget",
    "SqliteTarget",
    "Version",
    "default_sqlite_path",
    "serving_from_env",
    "table_name",
]

TARGETS = ("sqlite", "postgres", "redis")


def serving_from_env() -> ServingTarget:
    """The serving target the settings choose (docs/serving.md)."""
    kind = os.environ.get("NIGHTSHIFT_SERVING") or "sqlite"
    keep = os.environ.get("NIGHTSHIFT_SERVING_KEEP_VERSIONS")
    common = {"keep_versions": int(keep)} if keep else {}
    if kind == "sqlite":
        return SqliteTarget(path=os.environ.get("NIGHTSHIFT_SERVING_PATH") or None, **common)
    if kind == "postgres":
        dsn = os.environ.get("NIGHTSHIFT_SERVING_DSN")
        if not dsn:
            raise ValueError("NIGHTSHIFT_SERVING=postgres needs NIGHTSHIFT_SERVING_DSN")
        return PostgresTarget(dsn=dsn, **common)
    if kind == "redis":
        url = os.environ.get("NIGHTSHIFT_SERVING_REDIS_URL")
        if not url:
            raise ValueError("NIGHTSHIFT_SERVING=redis needs NIGHTSHIFT_SERVING_REDIS_URL")
        return RedisTarget(url=url, **common)
    raise ValueError(f"NIGHTSHIFT_SERVING={kind!r}: expected one of {', '.join(TARGETS)}")
