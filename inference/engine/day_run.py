"""One day's work as the engine runs it: the writer that places its shards, quarantine and side
output (and the fingerprint of everything that decides them), its entry in the run's cost
ledger, its shards on the pool with progress saved as they finish, and the figures of what it
did. No Dagster: the spot-safe step (assets/checkpointing.py) hands it the day with the run's
settings and reports what comes back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TextIO

import pyarrow.fs as pafs

from inference.engine.backstop import KillNote
from inference.engine.batch_timeout import BatchTimeout
from inference.engine.ledger import OpenDay, RunLedger, kill_note_path
from inference.engine.metrics import BatchMetrics
from inference.engine.observer import DayObserver
from inference.engine.output_partition import (
    PartitionTarget,
    ShardReport,
    fingerprint,
    input_fingerprint,
)
from inference.engine.progress import ProgressLine, ProgressLog, partition_line
from inference.engine.shard_worker import FixedProgram, ModelStep, ShardInput, ShardJob
from inference.engine.shard_writer import ShardedWriter, ShardFileTargets
from inference.engine.shards import (
    Interrupted,
    ShardPool,
    Stalled,
    Watch,
    row_range_shards,
    run_partition,
)
from inference.engine.watchdog import StallLimit
from inference.engine.work import SampledProgram, Work, quarantine_asset
from policy.ready_by import NightFacts


@dataclass(frozen=True)
class DaySettings:
    """What the run decides for each of its days: where tables live (``targets``: asset and
    date -> the day's target), the run's lineage (a retry may take over its lease at once), the
    lease's length, input rows per shard when the work names none (0: checkpointing off),
    rows per model call when the work names none, how long the day may go without a model
    call finishing before the progress watchdog fails it, and how long one model call may run
    when the work names no deadline of its own."""

    targets: Callable[[str, str], PartitionTarget]
    fs: pafs.FileSystem
    lineage: str
    lease_seconds: float
    shard_rows: Callable[[int, int | None], int]
    batch_size: int
    stall: StallLimit = StallLimit()
    batch_timeout: BatchTimeout = BatchTimeout()
    # On Ray: a straggler's copy after this many median shards, and a stalled worker replaced
    # (inference/engine/shards.py, Watch); 0: neither.
    straggler_multiple: float = 0.0
    # Where the day's live progress line goes (``nightshift run``: the terminal); None: nowhere.
    progress_line: TextIO | None = None
    # Run by the backstop once it killed the step, the line on its stdin (KillNote.then).
    after_kill: tuple[str, ...] = ()


@dataclass(frozen=True)
class AtLaunch:
    """A day's first launch (not a relaunch): ``tell`` is handed how to read what the capacity
    policy is told about the day, from its ledger, the run's ``tags`` and ``on_demand_after``;
    the reader runs inside the policy's error guard."""

    tell: Callable[[Callable[[], NightFacts]], None]
    tags: Mapping[str, str]
    on_demand_after: int


@dataclass(frozen=True)
class RanDay:
    """What running a day did: its shards' report, and its batch figures (rows in and out
    describe the whole day, resumed shards included; batches and rows computed, this attempt's
    work)."""

    shards: ShardReport
    metrics: BatchMetrics
    watch: Watch


def run_day(
    asset: str,
    date: str,
    work: Work,
    settings: DaySettings,
    ledger: RunLedger,
    pool: ShardPool,
    stop: Callable[[], str | None],
    log: Callable[[str], None],
    *,
    sample: Any = None,
    audit: bool = False,
    at_launch: AtLaunch | None = None,
    observer: DayObserver | None = None,
) -> RanDay:
    """Scores one day (the day of table ``<asset>``) and commits it exactly once; with
    ``audit`` the day is only staged (``shards.staged``) for its checks.

    ``at_launch``: told on the day's first attempt only (see :class:`AtLaunch`). ``sample``
    takes the checks' sample as rows stream, where shards run in this process. ``observer``
    is told the day's live figures after each shard (:mod:`inference.engine.observer`).
    """
    writer = day_writer(asset, date, work, settings, audit)
    quarantine = work.input.quarantine
    rows = quarantine.rows if quarantine else None
    progress_log = ProgressLog(log, f"{asset} {date}", rows)
    day = ledger.open(asset, date, writer, rows, work.sizes.batch_size or settings.batch_size)
    killed = day.take_kill_note()
    if killed is not None:
        writer.count_killed_stall()
        told = killed.get("line")
        log(f"{asset} {date}: the attempt before was killed by the watchdog's backstop: {told}")
    if at_launch is not None and len(day.ledger.attempts) == 1:
        facts = at_launch.tags, at_launch.on_demand_after
        at_launch.tell(lambda: day.night_facts(0, ledger.capacity, *facts))

    shown = (
        ProgressLine(settings.progress_line, f"{asset} {date}", rows)
        if settings.progress_line is not None
        else None
    )

    def progress(rows: int, resumed: int, shards: int) -> None:
        progress_log(rows, resumed, shards)
        if shown is not None:
            shown(rows, resumed, shards)
        day.attempt.rows, day.saving = rows - resumed, True
        day.save()

    watch = Watch(
        stop,
        progress,
        BatchMetrics(),
        watchdog=pool.watchdog(
            settings.stall, _kill_note(writer, asset, date, ledger, settings.after_kill)
        ),
        straggler_multiple=settings.straggler_multiple,
        observer=observer,
    )
    job = _job(work, writer, settings, sample if pool.in_process else None)
    try:
        shards = run_partition(writer, _entered(day, _shards(work, writer)), job, pool, watch)
    except BaseException as exc:
        ledger.left(day, interrupted=isinstance(exc, Interrupted))
        if isinstance(exc, Stalled):
            # The time the day waited for nothing: the capacity policy counts it as work left.
            day.attempt.stalled_s += exc.stall.waited
        raise
    finally:
        watch.watchdog.stand_down()  # the day's model calls are over
        day.attempt.stalled_s += watch.stalled_s  # stalls got past by replacing a worker
        day.save()
        if shown is not None:
            shown.close()
    ledger.close(day, shards)
    if shards.shards_resumed or shards.rows_redone:
        log(
            f"{asset} {date}: resumed {shards.shards_resumed} finished shards, "
            f"redid {shards.rows_redone} rows (attempt {shards.attempt})"
        )
    metrics = watch.metrics
    metrics.rows_in, metrics.rows_out = shards.rows_in, shards.rows_out
    finished = metrics.finish()
    log(partition_line(asset, date, finished, shards.uri))
    return RanDay(shards, finished, watch)


def _kill_note(
    writer: ShardedWriter, asset: str, date: str, ledger: RunLedger, after_kill: tuple[str, ...]
) -> KillNote:
    """Where a backstop that kills the step says so, for the day's next attempt to read."""
    target = writer.target
    where = f"{asset} {date}"
    return KillNote(
        target.fs, kill_note_path(target), where, ledger.run_id, ledger.capacity, after_kill
    )


def day_writer(
    asset: str, date: str, work: Work, settings: DaySettings, audit: bool = False
) -> ShardedWriter:
    """The day's writer, its fingerprint made of everything that decides the output."""
    quarantine, side = work.input.quarantine, work.output.side
    decided_by = [input_fingerprint(settings.fs, work.input.files or []), work.depends_on]
    if quarantine is not None:
        decided_by.append(quarantine.digest())
    decided_by.append(work.input.layout)
    targets = settings.targets
    where = ShardFileTargets(
        targets(asset, date),
        work.output.schema,
        targets(quarantine_asset(asset), date) if quarantine else None,
        targets(side[0], date) if side else None,
        side[1] if side else None,
    )
    return ShardedWriter(
        where,
        fingerprint(*decided_by),
        settings.shard_rows(work.sizes.default_shard_rows, work.sizes.shard_rows),
        settings.lineage,
        settings.lease_seconds,
        audit=audit,
    )


def _entered(
    day: OpenDay, shards: Callable[[], Iterable[ShardInput]]
) -> Callable[[], Iterable[ShardInput]]:
    """``shards``, with the attempt saved in the day's ledger once staging is settled (the
    writer's ``begin``) and before any shard is handed out: a process killed in its first shard
    leaves its trace (inference/engine/oom_killed.py), and the day's own staging files are
    written before it, so a full disk is met where the day's data goes."""

    def entered() -> Iterable[ShardInput]:
        day.save()
        return shards()

    return entered


def _shards(work: Work, writer: ShardedWriter) -> Callable[[], Iterable[ShardInput]]:
    """The day's shards: the domain's own cut, else row ranges of its batches."""
    if work.input.shards is not None:
        return work.input.shards
    return lambda: row_range_shards(work.input.batches, writer.shard_rows)


def _job(work: Work, writer: ShardedWriter, settings: DaySettings, sample: Any) -> ShardJob:
    program = work.program
    if isinstance(program, ModelStep):
        program = FixedProgram(program)
    if sample is not None:
        columns = work.output.sample
        program = SampledProgram(program, sample, None if columns is True else columns)
    return ShardJob(
        writer.files(),
        program,
        work.sizes.batch_size or settings.batch_size,
        work.input.quarantine,
        writer.target.uri(writer.target.data_dir()),
        _batch_timeout(work, settings),
    )


def _batch_timeout(work: Work, settings: DaySettings) -> BatchTimeout:
    """The run's per-call deadline, with the spec's own multiple where it names one."""
    multiple = work.sizes.batch_timeout_multiple
    if multiple is None:
        return settings.batch_timeout
    return replace(settings.batch_timeout, multiple=multiple)
