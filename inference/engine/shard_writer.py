"""The writer of one checkpointed output partition: staging, progress, leases, the commit.

Each finished shard is written to a staging folder and recorded in ``_progress.json`` (atomic
rename locally, a single PUT on S3). A retry with the same fingerprint (input files, model
version, settings) keeps finished shards; a different fingerprint discards the old progress.
When every shard is present the day is committed to the output's Apache Iceberg table
(``inference.engine.tables``): one catalog commit replaces the day, so a reader sees the old day
or the new one, never none, both or a mix. With ``audit`` the day is only staged (a snapshot
on a branch of its own) and the caller publishes it once its checks pass, or rejects it. A
lease makes the partition single-writer (see ``inference.engine.leases``); a re-run of a
committed partition replaces it.

Quarantined rows (see ``inference.engine.quarantine``) are written with their shard, as
``_quarantine/shard-NNNNN.parquet`` in the same staging folder and recorded in the same progress
entry, so a shard's outputs and its quarantined rows are kept or redone together. The commit
stages them in ``<asset>_quarantine`` with the same commit id as the output, and publishing puts
the companions on main before the output, so a reader that sees the output's commit finds its
companions' too. Exact output statistics (``inference.engine.invariants``) travel in the
progress entries the same way.

A side output (rows a downstream asset needs that are not part of the output's own contract, e.g.
the landing details of flagged transactions for ``fraud_alerts``) follows the same path as the
quarantine: ``_side/shard-NNNNN.parquet`` beside each shard, committed to its own table with the
same commit id, so a downstream asset reads exactly what was scored instead of re-reading
landing. A write that fails for lack of space says which file and how much space was left.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.parquet as pq

from inference.engine.invariants import StreamStats
from inference.engine.leases import Lease, PartitionLeasedError, acquire_lease
from inference.engine.output_partition import (
    PROGRESS,
    QUARANTINE_DIR,
    SIDE_DIR,
    PartitionIO,
    PartitionTarget,
    ShardReport,
)
from inference.engine.tables import DaySnapshot, StagedDay


@dataclass
class _Progress:
    fingerprint: str
    shard_rows: int
    attempts: int = 0
    interruptions: int = 0
    stalls: int = 0  # the progress watchdog's: those that failed the step, and those got past
    shards: dict[str, dict[str, int | str]] = field(default_factory=dict)
    in_flight: int | None = None
    discarded_rows: int | None = None


@dataclass(frozen=True)
class ShardFileTargets:
    """Where one partition's shard files are written: its staging area and companions."""

    target: PartitionTarget
    schema: pa.Schema
    quarantine: PartitionTarget | None = None
    side: PartitionTarget | None = None
    side_schema: pa.Schema | None = None


@dataclass(frozen=True)
class ShardFiles:
    """What writing one shard's files produced, for its progress entry."""

    name: str
    rows: int
    rows_quarantined: int
    quarantine_file: str | None
    side_file: str | None
    rows_side: int


def shard_file_name(shard: int) -> str:
    return f"shard-{shard:05d}.parquet"


def write_shard_files(
    where: ShardFileTargets,
    shard: int,
    tables: Iterable[pa.Table],
    quarantined: list[pa.Table],
    side: list[pa.Table],
) -> ShardFiles:
    """Writes one shard's output, quarantined rows and side rows into staging, each atomically
    under the shard's fixed name: writing a shard twice (a retried worker) leaves one copy."""
    io, name = PartitionIO(where.target), shard_file_name(shard)
    rows = io.write_parquet(f"{where.target.staging_dir}/{name}", tables, where.schema)
    held = [t for t in quarantined if t.num_rows]
    quarantine_file = io.write_beside(QUARANTINE_DIR, where.quarantine, name, held)
    side_rows = [t for t in side if t.num_rows]
    side_file = io.write_beside(SIDE_DIR, where.side, name, side_rows, where.side_schema)
    return ShardFiles(
        name,
        rows,
        sum(t.num_rows for t in held),
        quarantine_file,
        side_file,
        sum(t.num_rows for t in side_rows),
    )


def stage_shard_files(
    io: PartitionIO,
    target: PartitionTarget,
    folder: str,
    names: list[str],
    schema: pa.Schema,
    figures: dict,
) -> DaySnapshot:
    """Stages ``target``'s table day from the shard files ``names`` in staging's ``folder``.

    The shard files become the table's data files as they are: each is linked (copied on the
    server, on S3) into the day's folder of the table under the commit's name, then
    registered from its footer. No row is read or written again, so the commit costs a few
    file operations and catalog writes whatever the day's size; removing staging afterwards
    leaves the table's links, and a day interrupted before its commit still finds its shards.
    """
    day = target.table
    table = day.tables.ensure(day.name, schema)
    into = target.data_dir(table)
    placed = [io.link(f"{folder}/{name}", f"{into}/{figures['commit']}-{name}") for name in names]
    return day.tables.stage_files(day.name, day.date, schema, placed, figures, table)


class ShardedWriter:
    """Writes one partition shard by shard under a lease, and commits it once.

    Args:
        where: the partition's locations and schema, and its companions' (quarantine and side
            output, each None when the caller has none).
        fingerprint: what the output depends on; progress with another fingerprint is discarded.
        shard_rows: input rows per shard; 0 disables checkpointing (one shard, no progress).
        lineage: the run lineage that may take over its own stale lease at once.
        lease_seconds: how long the lease lasts without renewal (renewed after every shard).
        audit: stage the day at the commit and leave publishing it to the caller (its checks
            read the staged snapshot first); else the commit publishes it at once.
    """

    def __init__(
        self,
        where: ShardFileTargets,
        fingerprint: str,
        shard_rows: int,
        lineage: str,
        lease_seconds: float = 600.0,
        audit: bool = False,
    ):
        if where.target.table is None:
            raise ValueError(f"{where.target.final_dir}: a partition writer needs its table")
        self.audit = audit
        if where.side is not None and where.side_schema is None:
            raise ValueError("a side output needs its schema")
        self.where, self.target, self.schema, self.fp = (
            where,
            where.target,
            where.schema,
            fingerprint,
        )
        self.quarantine, self.side, self.side_schema = (
            where.quarantine,
            where.side,
            where.side_schema,
        )
        self.shard_rows, self.lineage, self.lease_seconds = shard_rows, lineage, lease_seconds
        self.checkpointing = shard_rows > 0
        self.progress = _Progress(fingerprint, shard_rows)
        self.report = ShardReport()
        self._lease: Lease | None = None
        self.io = PartitionIO(where.target)
        self._where_with_ids: ShardFileTargets | None = None
        self._killed_stalls = 0

    def count_killed_stall(self) -> None:
        """The attempt before was killed by the watchdog's backstop, which cannot write the
        progress file: counted as an interruption and a stall when the progress is loaded."""
        self._killed_stalls += 1

    def begin(self) -> ShardReport:
        """Takes the lease and loads (or resets) progress; returns what was already done."""
        t = self.target
        self._lease = acquire_lease(t.cas, t.lease_path, self.lineage, self.lease_seconds)
        committed = t.table.current()
        if (
            committed is not None
            and committed.text("fingerprint") == self.fp
            and committed.text("lineage") == self.lineage
            and not self.io.exists(t.staging_dir)
        ):
            # This lineage already committed exactly this output (it was stopped after the
            # commit but before the orchestrator heard of it): nothing to redo.
            self._report_committed(committed)
            return self.report
        stored = self.io.read_json(f"{t.staging_dir}/{PROGRESS}") if self.checkpointing else None
        if (
            stored
            and stored.get("fingerprint") == self.fp
            and stored.get("shard_rows") == self.shard_rows
        ):
            self.progress = _Progress(**stored)
        else:
            # No progress, or progress for other inputs, model or settings: start clean.
            self.io.delete_dir(t.staging_dir)
        self.progress.attempts += 1
        self.progress.interruptions += self._killed_stalls
        self.progress.stalls += self._killed_stalls
        self._killed_stalls = 0
        self.report.attempt = self.progress.attempts
        self.report.interruptions = self.progress.interruptions
        self.report.stalls = self.progress.stalls
        self.io.mkdir(t.staging_dir)
        self._save_progress()
        return self.report

    def _with_field_ids(self) -> ShardFileTargets:
        """Where shard files go, with the schemas they are written in: the tables' own field
        ids, so the commit registers the files as they are (see
        inference.engine.tables.with_field_ids); found once, on the first call (the tables are
        created then if new). The quarantine's columns are known only from its rows: its files
        are written again through the table at the commit (few rows)."""
        if self._where_with_ids is None:
            tables = self.target.table.tables
            side_schema = self.where.side_schema
            if self.side is not None and self.side.table is not None and side_schema:
                side_schema = tables.file_schema(self.side.table.name, side_schema)
            self._where_with_ids = replace(
                self.where,
                schema=tables.file_schema(self.target.table.name, self.schema),
                side_schema=side_schema,
            )
        return self._where_with_ids

    def done(self, shard: int) -> bool:
        return str(shard) in self.progress.shards

    def write_shard(self, shard: int, tables: Iterable[pa.Table], rows_in: int) -> int:
        """Writes a shard's output here, atomically, and records it; returns its output rows
        (a whole partition published at once, or an empty one)."""
        files = write_shard_files(self.files(), shard, tables, [], [])
        return self.record_shard(shard, files, rows_in)

    def files(self) -> ShardFileTargets:
        """Where shard files go: what a worker elsewhere needs to write them (picklable)."""

        # The lease and the commit stay with the driver: workers get the locations without the
        # compare-and-swap store or the catalog (neither pickles, and workers must not use them).
        def files_only(target: PartitionTarget | None) -> PartitionTarget | None:
            return replace(target, cas=None, table=None) if target is not None else None

        return replace(
            self._with_field_ids(),
            target=files_only(self.target),
            quarantine=files_only(self.quarantine),
            side=files_only(self.side),
        )

    def record_shard(
        self,
        shard: int,
        files: ShardFiles,
        rows_in: int,
        stats: StreamStats | None = None,
        rows_scored: int | None = None,
    ) -> int:
        """Records a shard whose files are written (here or by a worker) in the progress file."""
        self.progress.shards[str(shard)] = {
            "file": files.name,
            "rows_in": rows_in,
            "rows_out": files.rows,
            "rows_scored": rows_in - files.rows_quarantined if rows_scored is None else rows_scored,
            "rows_quarantined": files.rows_quarantined,
            "quarantine_file": files.quarantine_file,
            "side_file": files.side_file,
            "rows_side": files.rows_side,
            "stats": (stats or StreamStats()).to_json(),
        }
        self.progress.in_flight, self.progress.discarded_rows = None, None
        self._save_progress()
        if self._lease is not None:
            self._lease.renew()
        return files.rows

    def record_interruption(self, rows_discarded: int, stalled: bool = False) -> None:
        """Counts an interruption durably (``stalled``: one the progress watchdog raised);
        ``rows_discarded``: the work the shards in flight lost (their markers tell the retry
        the same, shard by shard)."""
        self.progress.interruptions += 1
        self.progress.stalls += stalled
        self.report.stalls = self.progress.stalls
        self.progress.in_flight = None
        self.progress.discarded_rows = rows_discarded
        self.report.interruptions = self.progress.interruptions
        self._save_progress()

    def record_stall(self) -> None:
        """Counts durably a stall the pool got past without failing the step (the stuck
        worker was replaced and its shard handed out again)."""
        self.progress.stalls += 1
        self.report.stalls = self.progress.stalls
        self._save_progress()

    def commit(self, shards: int) -> ShardReport:
        """Publishes shards 0..shards-1 as the partition, replacing any previous one."""
        t = self.target
        missing = [i for i in range(shards) if not self.done(i)]
        if missing:
            raise RuntimeError(f"cannot commit {t.uri(t.data_dir())}: shards {missing} missing")
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
        figures = {
            "commit": commit,
            "fingerprint": self.fp,
            "lineage": self.lineage,
            "rows": rows,
            "rows_in": report.rows_in,
            "rows_scored": report.rows_scored,
            "rows_quarantined": report.rows_quarantined,
            "rows_side": report.rows_side,
            "stats": report.stats.to_json(),
            "committed_at": time.time(),
            "attempts": self.progress.attempts,
            "interruptions": self.progress.interruptions,
            "stalls": self.progress.stalls,
        }
        report.commit = commit
        staged = StagedDay()
        # Companions first: publishing follows this order, so the output's commit on main is
        # the day's commit point, and its companions are already there when a reader sees it.
        if self.quarantine is not None:
            held = [str(e["quarantine_file"]) for e in entries if e.get("quarantine_file")]
            self._stage(
                staged,
                self.quarantine,
                QUARANTINE_DIR,
                held,
                None,
                figures,
                report.rows_quarantined,
            )
            report.quarantine_uri = self.quarantine.uri(self.quarantine.data_dir())
        if self.side is not None:
            sides = [str(e["side_file"]) for e in entries if e.get("side_file")]
            self._stage(
                staged, self.side, SIDE_DIR, sides, self.side_schema, figures, report.rows_side
            )
            report.side_uri = self.side.uri(self.side.data_dir())
        self._stage(staged, t, "", files, self.schema, figures, rows)
        report.shards, report.uri, report.rows_out = shards, t.uri(t.data_dir()), rows
        if self.audit:
            # Staging stays until the day is published or rejected: a crash before then
            # leaves a retry every shard to resume, and it goes under the lease again.
            staged.done = self._discard_under_lease
            report.staged = staged
        else:
            staged.publish()
            report.published_ids = dict(staged.published_ids)
            self.discard_staging()
        return report

    def _discard_under_lease(self) -> None:
        """Removes staging after the caller published or rejected the staged day, once the
        writer has let go of the partition: under the lease again, unless another run holds
        it now (the staging area is that run's)."""
        t = self.target
        try:
            lease = acquire_lease(t.cas, t.lease_path, self.lineage, self.lease_seconds)
        except PartitionLeasedError:
            return
        try:
            self.discard_staging()
        finally:
            lease.release()

    def _stage(
        self,
        staged: StagedDay,
        target: PartitionTarget,
        subdir: str,
        files: list[str],
        schema: pa.Schema | None,
        figures: dict,
        rows: int,
    ) -> None:
        """Stages one table's day from the shard files in ``subdir`` of staging. A companion
        without rows and without a schema of its own takes its table's; with neither (no table
        yet), there is no earlier day to replace and nothing is staged."""
        folder = "/".join(p for p in (self.target.staging_dir, subdir) if p)
        day = target.table
        if schema is None:
            if files:
                schema = pq.read_schema(f"{folder}/{files[0]}", filesystem=self.target.fs)
            else:
                schema = day.tables.schema(day.name)
                if schema is None:
                    return
        snapshot = stage_shard_files(
            self.io, target, folder, files, schema, {**figures, "rows": rows}
        )
        staged.parts.append((day, snapshot))

    def _report_committed(self, committed: DaySnapshot) -> None:
        report = self.report
        report.already_committed = True
        report.uri = self.target.uri(self.target.data_dir())
        report.rows_out = int(committed.value("rows", 0))
        report.rows_in = int(committed.value("rows_in", 0))
        report.rows_scored = int(committed.value("rows_scored", report.rows_in))
        report.rows_quarantined = int(committed.value("rows_quarantined", 0))
        report.stats = StreamStats.from_json(committed.value("stats"))
        report.rows_side = int(committed.value("rows_side", 0))
        report.commit = committed.commit
        if self.quarantine is not None:
            report.quarantine_uri = self.quarantine.uri(self.quarantine.data_dir())
        if self.side is not None:
            report.side_uri = self.side.uri(self.side.data_dir())

    def discard_staging(self) -> None:
        """Removes what an uncommitted attempt left in staging (used when not checkpointing)."""
        self.io.delete_dir(self.target.staging_dir)

    def close(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def _save_progress(self) -> None:
        if self.checkpointing:
            self.io.write_json(f"{self.target.staging_dir}/{PROGRESS}", self.progress.__dict__)
