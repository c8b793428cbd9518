"""An output partition: where its staging area and lease live, the names inside it, what decides
its content (fingerprints), what writing it did (``ShardReport``) and the file operations on its
filesystem (``PartitionIO``).

Files are written whole: parquet and JSON through a temporary file renamed into place locally,
in one PUT on S3. A companion's (quarantine, side output) files wait in the writing partition's
staging folder until the day is committed to its Iceberg tables (``inference.engine.tables``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from inference.engine.diskspace import writing
from inference.engine.invariants import StreamStats
from inference.engine.leases import CasStore
from inference.engine.tables import DayTable, StagedDay, TableError, day_folder, local_location

PROGRESS = "_progress.json"
# Underscore folders are skipped by Hive-style readers (pyarrow, Spark, Athena) of a partition.
QUARANTINE_DIR = "_quarantine"
SIDE_DIR = "_side"
# Statistics counts named "quarantined:<reason>" hold the partition's quarantined rows by reason.
QUARANTINED_PREFIX = "quarantined:"


@dataclass(frozen=True)
class PartitionTarget:
    """Where one output partition's table day, staging area and lease live; ``final_dir`` is
    the folder of the day's data files in its table."""

    fs: pafs.FileSystem
    final_dir: str
    staging_dir: str
    lease_path: str
    cas: CasStore | None
    uri_prefix: str = ""
    table: DayTable | None = None

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def data_dir(self, table=None) -> str:
        """The folder of the day's data files: under its table's location (``table``, else
        loaded), which a catalog that assigns locations chooses itself; ``final_dir`` before
        the table exists. Raises TableError where that location is not on this filesystem."""
        day = self.table
        if day is None:
            return self.final_dir
        table = table if table is not None else day.tables.load(day.name)
        if table is None:
            return self.final_dir
        location = table.location()
        if local_location(location) != self.local:
            raise TableError(
                f"table {day.tables.identifier(day.name)} is at {location}, not on the data "
                f"root's filesystem ({self.uri(self.final_dir)}): give its catalog a "
                "warehouse there"
            )
        return day_folder(table, day.date)

    def uri(self, path: str) -> str:
        return f"{self.uri_prefix}{path}"


@dataclass
class ShardReport:
    """What the checkpointing did for one partition."""

    shards: int = 0
    shards_resumed: int = 0
    rows_redone: int = 0
    attempt: int = 1
    interruptions: int = 0
    stalls: int = 0  # the progress watchdog's: those that failed the step, and those got past
    stragglers_copied: int = 0  # shards given a second copy on Ray (this attempt)
    straggler_copy_won: int = 0  # of those, the copies that finished first
    already_committed: bool = False
    uri: str = ""
    rows_in: int = 0
    rows_out: int = 0
    rows_scored: int = 0
    rows_quarantined: int = 0
    quarantine_uri: str = ""
    rows_side: int = 0
    side_uri: str = ""
    commit: str = ""
    stats: StreamStats = field(default_factory=StreamStats)
    # The day staged in its tables and waiting for its checks (write-audit-publish), or None
    # once it is published or when it was published at once.
    staged: StagedDay | None = None
    # table -> the snapshot that put the day on its main, once published here.
    published_ids: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "shards_resumed": self.shards_resumed,
            "rows_redone": self.rows_redone,
            "attempt": self.attempt,
            "interruptions": self.interruptions,
            "stalls": self.stalls,
            "stragglers_copied": self.stragglers_copied,
            "straggler_copy_won": self.straggler_copy_won,
        }


def fingerprint(*parts: Any) -> str:
    """A stable hash of whatever decides a partition's output (inputs, model, settings)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def input_fingerprint(fs: pafs.FileSystem, files: list[str]) -> list[tuple[str, int, str]]:
    """Identity of input files: path, size and modification time (ETag-like)."""
    infos = fs.get_file_info(files)
    return [(i.path, i.size or 0, str(i.mtime_ns or i.mtime)) for i in infos]


class PartitionIO:
    """Writes, reads and removes files on ``target``'s filesystem; local writes go through a
    temporary file, and a write that fails for lack of space names the file."""

    def __init__(self, target: PartitionTarget):
        self.target = target

    def write_parquet(self, path: str, tables: Iterable[pa.Table], schema: pa.Schema) -> int:
        tmp = f"{path}.tmp" if self.target.local else path
        with self._writing(tmp, path):
            rows = self._write_tables(tmp, tables, schema)
        if self.target.local:
            self.target.fs.move(tmp, path)
        return rows

    def write_beside(
        self,
        subdir: str,
        target: PartitionTarget | None,
        name: str,
        tables: list[pa.Table],
        schema: pa.Schema | None = None,
    ) -> str | None:
        """Writes a shard's companion rows (quarantined, side output) into ``subdir`` of staging;
        removes a stale file when the shard now has none."""
        path = f"{self.target.staging_dir}/{subdir}/{name}"
        if not tables:
            if target is not None and self.exists(path):
                self.target.fs.delete_file(path)
            return None
        if target is None:
            raise ValueError(f"a shard has rows for {subdir} but the writer has no target for it")
        self.mkdir(f"{self.target.staging_dir}/{subdir}")
        self.write_parquet(path, tables, schema or tables[0].schema)
        return name

    def _write_tables(self, tmp: str, tables: Iterable[pa.Table], schema: pa.Schema) -> int:
        rows, out = 0, None
        try:
            for table in tables:
                table = table.select(schema.names).cast(schema)
                if out is None:
                    out = pq.ParquetWriter(
                        tmp,
                        schema,
                        filesystem=self.target.fs,
                        use_dictionary=dictionary_columns(table),
                    )
                out.write_table(table)
                rows += table.num_rows
            if out is None:  # no rows: an empty file that still carries the schema
                out = pq.ParquetWriter(tmp, schema, filesystem=self.target.fs)
        finally:
            if out is not None:
                out.close()
        return rows

    def _writing(self, tmp: str, path: str):
        """Removes a failed write's temporary file, and names the file when space ran out."""

        def cleanup() -> None:
            if tmp != path and self.exists(tmp):
                self.target.fs.delete_file(tmp)

        return writing(path, self.target.uri(path), cleanup, local=self.target.local)

    def write_json(self, path: str, data: dict) -> None:
        raw = json.dumps(data, sort_keys=True).encode()
        fs = self.target.fs
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}" if self.target.local else path
        with self._writing(tmp, path):
            with fs.open_output_stream(tmp) as out:
                out.write(raw)
        if tmp != path:
            fs.move(tmp, path)

    def read_json(self, path: str) -> dict | None:
        try:
            with self.target.fs.open_input_stream(path) as stream:
                return json.loads(stream.read())
        except (FileNotFoundError, OSError):
            return None

    def link(self, source: str, path: str) -> str:
        """Puts the file at ``source`` also at ``path`` without its bytes passing through
        this process: a hard link locally (a copy where the filesystem cannot link), a
        server-side copy on S3. Returns ``path``'s URI, as a table records its files."""
        fs = self.target.fs
        if not self.target.local:
            fs.copy_file(source, path)
            return self.target.uri(path)
        with self._writing(path, path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                os.link(source, path)
            except FileExistsError:  # names carry the commit id: this one is stale
                os.unlink(path)
                os.link(source, path)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                shutil.copyfile(source, path)
            # A link shares its file's times: it gets a fresh one, or upkeep could take the
            # file of a day staged long after its shards were written for an old orphan in
            # the moment before its commit references it.
            os.utime(path)
        # As pyiceberg writes its own paths: not percent-encoded (it would not decode "%3D").
        return f"file://{os.path.abspath(path)}"

    def exists(self, path: str) -> bool:
        return self.target.fs.get_file_info(path).type != pafs.FileType.NotFound

    def delete_dir(self, path: str) -> None:
        if self.exists(path):
            self.target.fs.delete_dir(path)

    def mkdir(self, path: str) -> None:
        self.target.fs.create_dir(path, recursive=True)


def dictionary_columns(table: pa.Table, sample: int = 4096) -> list[str]:
    """Columns worth dictionary-encoding: those with at most half as many distinct values as
    rows in a leading sample (a model version, a reason), not ids or scores.

    Parquet tries a dictionary on every column by default and gives up only once it outgrows
    its page limit: on a shard of unique ids and float scores that makes the write several
    times slower and the file larger than a dictionary on the repetitive columns alone.
    """
    head = table.slice(0, sample)
    chosen = []
    for name in head.column_names:
        column = head[name]
        if pa.types.is_boolean(column.type) or not len(column):
            continue
        if pa.types.is_nested(column.type):  # lists and structs: parquet's default
            chosen.append(name)
        elif pc.count_distinct(column).as_py() * 2 <= len(column):
            chosen.append(name)
    return chosen
