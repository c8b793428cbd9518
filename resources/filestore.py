"""A data root on a local folder or S3: its filesystem, its paths, the data files of a folder, and
raw objects (models, manifests).

Layout (Hive-style, readable by pyarrow, Spark, DuckDB, Athena):
``<root>/landing/<dataset>/date=YYYY-MM-DD/*.parquet`` for inputs and
``<root>/outputs/<asset>/date=YYYY-MM-DD/`` for published outputs. As in Hive and Spark, a file
or folder whose name starts with ``_`` or ``.`` (``_SUCCESS``, ``_temporary/`` of an unfinished
write, ``.crc`` checksums, ``_committed_*``) is not data, nor is what a copy or write in
progress leaves (``*._COPYING_``, ``*.tmp``, ``*.crc``): it is never read as input. Which
files of a landing partition are parquet is decided by their bytes (``resources.landing_files``);
the listing here serves the published outputs, whose files nightshift names itself.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from inference.engine.diskspace import writing


@dataclass(frozen=True)
class Listing:
    """A partition folder's parquet data files, and the files under it that are not data."""

    files: list[pafs.FileInfo] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]


def is_data(relative: str) -> bool:
    """Whether a path below a partition folder is data: no part of it is a name Spark or Hadoop
    skips or leaves behind (see :func:`not_data_name`)."""
    return not any(not_data_name(part) for part in relative.split("/"))


# What copies and writes in progress leave beside a file: Hadoop's ``put`` writes
# ``x._COPYING_`` and renames it, editors and ``write_bytes`` write ``x.tmp`` or
# ``x.tmp-<id>``, and a checksum rides beside its file as ``x.crc``: all either unfinished or
# a second copy of a file the day already holds.
_NOT_DATA_SUFFIX = re.compile(r"(\._COPYING_|\.tmp|\.tmp-[^/.]*|\.crc)$", re.IGNORECASE)


def not_data_name(name: str) -> bool:
    """Whether a file or folder name is never data: one starting with ``_`` or ``.`` (the
    Hive/Spark convention for commit markers such as ``_SUCCESS``, unfinished writes under
    ``_temporary/`` and ``.crc`` checksums), or ending ``._COPYING_``, ``.tmp``,
    ``.tmp-<id>`` or ``.crc``."""
    return name.startswith(("_", ".")) or bool(_NOT_DATA_SUFFIX.search(name))


def open_filesystem(
    root: str, s3_endpoint: str | None = None, s3_region: str | None = None
) -> tuple[pafs.FileSystem, str, str]:
    """Resolves a data root to (filesystem, base path, display prefix)."""
    if root.startswith("s3://"):
        kwargs: dict = {}
        if s3_region:
            kwargs["region"] = s3_region
        if s3_endpoint:
            scheme, _, host = s3_endpoint.rpartition("://")
            kwargs["endpoint_override"] = host or s3_endpoint
            kwargs["scheme"] = scheme or "https"
        return pafs.S3FileSystem(**kwargs), root[len("s3://") :].rstrip("/"), "s3://"
    local = pafs.LocalFileSystem()
    base = os.path.abspath(root)
    local.create_dir(base, recursive=True)
    return local, base, ""


class FileStore:
    """The filesystem and paths under one data root, and raw objects written whole.

    Args:
        root: a local folder or ``s3://bucket/prefix``.
        s3_endpoint: endpoint override for S3-compatible servers (``http://127.0.0.1:9000``).
        s3_region: S3 region.
    """

    def __init__(self, root: str, s3_endpoint: str | None = None, s3_region: str | None = None):
        self.root = root
        self.s3_endpoint, self.s3_region = s3_endpoint, s3_region
        self.fs, self.base, self._scheme = open_filesystem(root, s3_endpoint, s3_region)

    def path(self, *parts: str) -> str:
        return "/".join([self.base, *parts])

    def uri(self, path: str) -> str:
        return f"{self._scheme}{path}"

    @property
    def models_dir(self) -> str:
        return self.path("models")

    def landing_path(self, dataset: str, date: str) -> str:
        return self.path("landing", dataset, f"date={date}")

    def output_path(self, asset: str, date: str) -> str:
        return self.path("outputs", asset, f"date={date}")

    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def _listing(self, path: str) -> Listing:
        info = self.fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            return Listing()
        files, skipped, start = [], [], len(path) + 1
        for f in self.fs.get_file_info(pafs.FileSelector(path, recursive=True)):
            if f.type != pafs.FileType.File:
                continue
            name = f.path
            if not is_data(name[start:]):
                skipped.append(name)
            elif name.endswith(".parquet"):
                files.append((name, f))
        files.sort(key=lambda entry: entry[0])
        return Listing([f for _, f in files], sorted(skipped))

    def _parquet_files(self, path: str) -> list[str]:
        return self._listing(path).paths

    def write_bytes(self, path: str, data: bytes) -> None:
        parent = path.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"

        def cleanup() -> None:
            if self.exists(tmp):
                self.fs.delete_file(tmp)

        with writing(path, self.uri(path), cleanup, local=not self._scheme):
            with self.fs.open_output_stream(tmp) as out:
                out.write(data)
        self.fs.move(tmp, path)

    def read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as stream:
            return stream.read()

    def _delete_dir(self, path: str) -> None:
        if self.exists(path):
            self.fs.delete_dir(path)
