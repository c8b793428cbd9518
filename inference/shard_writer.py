"""The writer of one checkpointed output partition: staging, progress, leases, the commit.

Each finished shard is written to a staging folder and recorded in ``_progress.json`` (atomic
rename locally, a single PUT on S3). A retry with the same fingerprint (input files, model
version, settings) keeps finished shards; a different fingerprint discards the old progress.
When every shard is present the partition is committed: locally the staging folder is renamed
into place (readers see the old or the new partition, never a mix); on S3 the shards are copied
under commit-unique names and ``_manifest.json`` is written last, so manifest-aware readers
never see a partial partition. A lease makes the partition single-writer (see
``inference.leases``); a re-run of a committed partition replaces it.

Quarantined rows (see ``inference.quarantine``) are written with their shard, as
``_quarantine/shard-NNNNN.parquet`` in the same staging folder and recorded in the same progress
entry, so a shard's outputs and its quarantined rows are kept or redone together. The commit
publishes them to ``outputs/<asset>_quarantine/date=D/`` first, then the partition, both
manifests carrying the same commit id; a retry after a crash between the two re-publishes both.
Exact output statistics (``inference.invariants``) travel in the progress entries the same way.

A side output (rows a downstream asset needs that are not part of the output's own contract, e.g.
the landing details of flagged transactions for ``fraud_alerts``) follows the same path as the
quarantine: ``_side/shard-NNNNN.parquet`` beside each shard, published to its own partition in the
same commit, so a downstream asset reads exactly what was scored instead of re-reading landing.

Nothing but the partition's data files and its manifest is published: whatever else an attempt
left in staging (a temporary file from a write that failed, a shard no longer wanted) is removed
at the commit. A write that fails for lack of space says which file and how much space was left.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from inference.diskspace import writing
from inference.invariants import StreamStats
from inference.leases import CasStore, Lease, acquire_lease

PROGRESS = "_progress.json"
MANIFEST = "_manifest.json"
# Underscore folders are skipped by Hive-style readers (pyarrow, Spark, Athena) of a partition.
QUARANTINE_DIR = "_quarantine"
SIDE_DIR = "_side"
# Statistics counts named "quarantined:<reason>" hold the partition's quarantined rows by reason.
QUARANTINED_PREFIX = "quarantined:"


@dataclass(frozen=True)
class PartitionTarget:
    """Where one output partition, its staging area and its lease live."""

    fs: pafs.FileSystem
    final_dir: str
    staging_dir: str
    trash_dir: str
    lease_path: str
    cas: CasStore
    uri_prefix: str = ""

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

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

    def as_dict(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "shards_resumed": self.shards_resumed,
            "rows_redone": self.rows_redone,
            "attempt": self.attempt,
            "interruptions": self.interruptions,
        }


def fingerprint(*parts: Any) -> str:
    """A stable hash of whatever decides a partition's output (inputs, model, settings)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def input_fingerprint(fs: pafs.FileSystem, files: list[str]) -> list[tuple[str, int, str]]:
    """Identity of input files: path, size and modification time (ETag-like)."""
    infos = fs.get_file_info(files)
    return [(i.path, i.size or 0, str(i.mtime_ns or i.mtime)) for i in infos]


@dataclass
class _Progress:
    fingerprint: str
    shard_rows: int
    attempts: int = 0
    interruptions: int = 0
    shards: dict[str, dict[str, int | str]] = field(default_factory=dict)
    in_flight: int | None = None
    discarded_rows: int | None = None


class ShardedWriter:
    """Writes one partition shard by shard under a lease, and commits it once.

    Args:
        target: the partition's locations.
        schema: the output schema.
        fingerprint: what the output depends on; progress with another fingerprint is discarded.
        shard_rows: input rows per shard; 0 disables checkpointing (one shard, no progress).
        lineage: the run lineage that may take over its own stale lease at once.
        lease_seconds: how long the lease lasts without renewal (renewed after every shard).
        quarantine: where quarantined rows are published (``outputs/<asset>_quarantine/``);
            None when the caller quarantines nothing.
        side: where the side output is published; None when there is none.
        side_schema: the side output's schema (required with ``side``).
    """

    def __init__(
        self,
        target: PartitionTarget,
        schema: pa.Schema,
        fingerprint: str,
        shard_rows: int,
        lineage: str,
        lease_seconds: float = 600.0,
        quarantine: PartitionTarget | None = None,
        side: PartitionTarget | None = None,
        side_schema: pa.Schema | None = None,
    ):
        if side is not None and side_schema is None:
            raise ValueError("a side output needs its schema")
        self.target, self.schema, self.fp = target, schema, fingerprint
        self.quarantine = quarantine
        self.side, self.side_schema = side, side_schema
        self.shard_rows, self.lineage, self.lease_seconds = shard_rows, lineage, lease_seconds
        self.checkpointing = shard_rows > 0
        self.progress = _Progress(fingerprint, shard_rows)
        self.report = ShardReport()
        self._lease: Lease | None = None
        self._redo_shard: int | None = None
        self._redo_rows: int | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def begin(self) -> ShardReport:
        """Takes the lease and loads (or resets) progress; returns what was already done."""
        t = self.target
        self._lease = acquire_lease(t.cas, t.lease_path, self.lineage, self.lease_seconds)
        committed = self._read_json(f"{t.final_dir}/{MANIFEST}")
        if (
            committed
            and committed.get("fingerprint") == self.fp
            and committed.get("lineage") == self.lineage
            and not self._exists(t.staging_dir)
        ):
            # This lineage already committed exactly this output (it was stopped after the
            # commit but before the orchestrator heard of it): nothing to redo.
            self.report.already_committed = True
            self.report.uri, self.report.rows_out = t.uri(t.final_dir), committed.get("rows", 0)
            self.report.rows_in = committed.get("rows_in", 0)
            self.report.rows_scored = committed.get("rows_scored", self.report.rows_in)
            self.report.rows_quarantined = committed.get("rows_quarantined", 0)
            self.report.stats = StreamStats.from_json(committed.get("stats"))
            self.report.rows_side = committed.get("rows_side", 0)
            self.report.commit = committed.get("commit", "")
            if self.quarantine is not None:
                self.report.quarantine_uri = self.quarantine.uri(self.quarantine.final_dir)
            if self.side is not None:
                self.report.side_uri = self.side.uri(self.side.final_dir)
            return self.report
        stored = self._read_json(f"{t.staging_dir}/{PROGRESS}") if self.checkpointing else None
        if (
            stored
            and stored.get("fingerprint") == self.fp
            and stored.get("shard_rows") == self.shard_rows
        ):
            self.progress = _Progress(**stored)
        else:
            # No progress, or progress for other inputs, model or settings: start clean.
            self._delete_dir(t.staging_dir)
        self._redo_shard, self._redo_rows = self.progress.in_flight, self.progress.discarded_rows
        self.progress.attempts += 1
        self.report.attempt = self.progress.attempts
        self.report.interruptions = self.progress.interruptions
        self._mkdir(t.staging_dir)
        self._save_progress()
        return self.report

    def done(self, shard: int) -> bool:
        return str(shard) in self.progress.shards

    def start_shard(self, shard: int) -> None:
        if self.checkpointing:
            self.progress.in_flight = shard
            self._save_progress()

    def write_shard(
        self,
        shard: int,
        tables: Iterable[pa.Table],
        rows_in: int,
        quarantined: list[pa.Table] | None = None,
        stats: StreamStats | None = None,
        rows_scored: int | None = None,
        side: list[pa.Table] | None = None,
    ) -> int:
        """Writes a finished shard atomically and records it; returns its output rows.

        Args:
            shard: the shard's index.
            tables: its output rows.
            rows_in: its input rows, quarantined ones included.
            quarantined: its quarantined rows, written beside it before the progress entry.
            stats: its output statistics, saved in the progress entry.
            rows_scored: input rows the model scored (default: all of ``rows_in``).
            side: its side-output rows, written beside it before the progress entry.
        """
        name = f"shard-{shard:05d}.parquet"
        rows = self._write_parquet(f"{self.target.staging_dir}/{name}", tables, self.schema)
        held = [t for t in quarantined or [] if t.num_rows]
        quarantine_file = self._write_beside(QUARANTINE_DIR, self.quarantine, name, held)
        side_rows = [t for t in side or [] if t.num_rows]
        side_file = self._write_beside(SIDE_DIR, self.side, name, side_rows, self.side_schema)
        if shard == self._redo_shard:
            # A graceful stop recorded how far the shard had got; after a kill without notice
            # the whole shard counts as redone.
            known = self._redo_rows
            self.report.rows_redone += known if known is not None else rows_in
        rows_quarantined = sum(t.num_rows for t in held)
        self.progress.shards[str(shard)] = {
            "file": name,
            "rows_in": rows_in,
            "rows_out": rows,
            "rows_scored": rows_in - rows_quarantined if rows_scored is None else rows_scored,
            "rows_quarantined": rows_quarantined,
            "quarantine_file": quarantine_file,
            "side_file": side_file,
            "rows_side": sum(t.num_rows for t in side_rows),
            "stats": (stats or StreamStats()).to_json(),
        }
        self.progress.in_flight, self.progress.discarded_rows = None, None
        self._save_progress()
        if self._lease is not None:
            self._lease.renew()
        return rows

    def record_interruption(self, shard: int | None, rows_discarded: int) -> None:
        self.progress.interruptions += 1
        self.progress.in_flight = shard
        self.progress.discarded_rows = rows_discarded
        self.report.interruptions = self.progress.interruptions
        self._save_progress()

    def commit(self, shards: int) -> ShardReport:
        """Publishes shards 0..shards-1 as the partition, replacing any previous one."""
        t = self.target
        missing = [i for i in range(shards) if not self.done(i)]
        if missing:
            raise RuntimeError(f"cannot commit {t.uri(t.final_dir)}: shards {missing} missing")
        entries = [self.progress.shards[str(i)] for i in range(shards)]
        files = [str(e["file"]) for e in entries]
        rows = sum(int(e["rows_out"]) for e in entries)
        report = self.report
        report.rows_in = sum(int(e["rows_in"]) for e in entries)
        report.rows_scored = sum(int(e.get("rows_scored", e["rows_in"])) for e in entries)
        report.rows_quarantined = sum(int(e.get("rows_quarantined", 0)) for e in entries)
        report.rows_side = sum(int(e.get("rows_side", 0)) for e in entries)
        report.stats = StreamStats()
        for e in entries:
            report.stats.merge(StreamStats.from_json(e.get("stats")))
        commit = uuid.uuid4().hex[:12]
        manifest = {
            "fingerprint": self.fp,
            "lineage": self.lineage,
            "commit": commit,
            "rows": rows,
            "rows_in": report.rows_in,
            "rows_scored": report.rows_scored,
            "rows_quarantined": report.rows_quarantined,
            "rows_side": report.rows_side,
            "stats": report.stats.to_json(),
            "committed_at": time.time(),
            "attempts": self.progress.attempts,
            "interruptions": self.progress.interruptions,
        }
        report.commit = commit
        # Companions first: a crash before the partition's own commit leaves the retry to redo
        # all of them, and a reader can tell they belong together by the shared commit id.
        if self.quarantine is not None:
            held = [str(e["quarantine_file"]) for e in entries if e.get("quarantine_file")]
            self._commit_beside(
                QUARANTINE_DIR, self.quarantine, held, {**manifest, "rows": report.rows_quarantined}
            )
            report.quarantine_uri = self.quarantine.uri(self.quarantine.final_dir)
        if self.side is not None:
            sides = [str(e["side_file"]) for e in entries if e.get("side_file")]
            self._commit_beside(
                SIDE_DIR, self.side, sides, {**manifest, "rows": report.rows_side}, self.side_schema
            )
            report.side_uri = self.side.uri(self.side.final_dir)
        if t.local:
            self._commit_by_rename(files, manifest)
        else:
            self._commit_by_manifest(t, t.staging_dir, files, manifest)
            self._delete_dir(t.staging_dir)
        report.shards, report.uri, report.rows_out = shards, t.uri(t.final_dir), rows
        return report

    def discard_staging(self) -> None:
        """Removes what an uncommitted attempt left in staging (used when not checkpointing)."""
        self._delete_dir(self.target.staging_dir)

    def close(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    # -- commit strategies ---------------------------------------------------------------
    def _commit_by_rename(self, files: list[str], manifest: dict) -> None:
        t = self.target
        self._write_json(f"{t.staging_dir}/{MANIFEST}", {**manifest, "files": files})
        # The manifest now records attempts and interruptions: progress has done its job, and
        # the companions' copies (published to their own partitions already) only served
        # retries. Anything else an attempt left (a failed write's temporary file) goes too.
        self._keep_only(t.staging_dir, {*files, MANIFEST})
        self._swap_in(t)

    def _swap_in(self, t: PartitionTarget) -> None:
        """Renames the staging folder into place; readers see the old or the new partition."""
        old = f"{t.trash_dir}/{uuid.uuid4().hex}"
        if self._exists(t.final_dir):
            self._mkdir(t.trash_dir)
            t.fs.move(t.final_dir, old)
        t.fs.move(t.staging_dir, t.final_dir)
        self._delete_dir(t.trash_dir)

    def _commit_by_manifest(
        self, t: PartitionTarget, source: str, files: list[str], manifest: dict
    ) -> None:
        parts = []
        for i, name in enumerate(files):
            part = f"part-{manifest['commit']}-{i:05d}.parquet"
            t.fs.copy_file(f"{source}/{name}", f"{t.final_dir}/{part}")
            parts.append(part)
        # The manifest is the commit point: written last, in one PUT.
        self._write_json(f"{t.final_dir}/{MANIFEST}", {**manifest, "files": parts})
        self._keep_only(t.final_dir, {*parts, MANIFEST})

    def _keep_only(self, folder: str, keep: set[str]) -> None:
        """Deletes every file and folder directly in ``folder`` whose name is not in ``keep``."""
        for info in self.target.fs.get_file_info(pafs.FileSelector(folder)):
            if info.base_name in keep:
                continue
            if info.type == pafs.FileType.Directory:
                self.target.fs.delete_dir(info.path)
            else:
                self.target.fs.delete_file(info.path)

    def _commit_beside(
        self,
        subdir: str,
        q: PartitionTarget,
        files: list[str],
        manifest: dict,
        schema: pa.Schema | None = None,
    ) -> None:
        """Publishes a companion (quarantined rows, side output; possibly no rows) as its own
        partition, replacing any earlier one, while the shards' copies stay in staging until the
        partition commits. A side output with no rows is still published, as an empty file."""
        source = f"{self.target.staging_dir}/{subdir}"
        if schema is not None and not files:
            self._mkdir(source)
            self._write_parquet(f"{source}/empty.parquet", [], schema)
            files = ["empty.parquet"]
        if not q.local:
            self._mkdir(q.final_dir)
            self._commit_by_manifest(q, source, files, manifest)
            return
        self._delete_dir(q.staging_dir)
        self._mkdir(q.staging_dir)
        for name in files:
            q.fs.copy_file(f"{source}/{name}", f"{q.staging_dir}/{name}")
        self._write_json(f"{q.staging_dir}/{MANIFEST}", {**manifest, "files": files})
        self._swap_in(q)

    def _write_parquet(self, path: str, tables: Iterable[pa.Table], schema: pa.Schema) -> int:
        tmp = f"{path}.tmp" if self.target.local else path
        with self._writing(tmp, path):
            rows = self._write_tables(tmp, tables, schema)
        if self.target.local:
            self.target.fs.move(tmp, path)
        return rows

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
            if tmp != path and self._exists(tmp):
                self.target.fs.delete_file(tmp)

        return writing(path, self.target.uri(path), cleanup, local=self.target.local)

    def _write_beside(
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
            if target is not None and self._exists(path):
                self.target.fs.delete_file(path)
            return None
        if target is None:
            raise ValueError(f"a shard has rows for {subdir} but the writer has no target for it")
        self._mkdir(f"{self.target.staging_dir}/{subdir}")
        self._write_parquet(path, tables, schema or tables[0].schema)
        return name

    # -- small helpers -------------------------------------------------------------------
    def _save_progress(self) -> None:
        if self.checkpointing:
            self._write_json(f"{self.target.staging_dir}/{PROGRESS}", self.progress.__dict__)

    def _write_json(self, path: str, data: dict) -> None:
        raw = json.dumps(data, sort_keys=True).encode()
        fs = self.target.fs
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}" if self.target.local else path
        with self._writing(tmp, path):
            with fs.open_output_stream(tmp) as out:
                out.write(raw)
        if tmp != path:
            fs.move(tmp, path)

    def _read_json(self, path: str) -> dict | None:
        try:
            with self.target.fs.open_input_stream(path) as stream:
                return json.loads(stream.read())
        except (FileNotFoundError, OSError):
            return None

    def _exists(self, path: str) -> bool:
        return self.target.fs.get_file_info(path).type != pafs.FileType.NotFound

    def _delete_dir(self, path: str) -> None:
        if self._exists(path):
            self.target.fs.delete_dir(path)

    def _mkdir(self, path: str) -> None:
        self.target.fs.create_dir(path, recursive=True)


def dictionary_columns(table: pa.Table, sample: int = 4096) -> list[str]:
    """Columns worth dictionary-encoding: those with at most half as many distinct values as
    rows in a leading sample (a model version, a reason), not ids or scores.

    Parquet tries a dictionary on every column by default and gives up only once it outgrows
    its page limit: for a 50k-row fraud_scores shard (unique transaction ids, float scores) that
    tripled the write, 6.3 ms against 2.5 ms with a dictionary on model_version alone, and the
    file was 40% larger.
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
