"""The one driver loop: a partition cut into shards, computed by a pool, published exactly once.

The driver (the Dagster step) keeps what makes a partition exactly once: the lease, the
progress file and the commit (:class:`~inference.engine.shard_writer.ShardedWriter`). It reads the
partition's shards, skips those an earlier attempt finished, hands the others to a
:class:`ShardPool` and records each shard once the pool has written its files. Where a shard is
computed is the pool's business: in this process (:class:`inference.engine.local_pool.LocalPool`) or on
Ray actors (:class:`inference.engine.ray_pool.RayPool`); the loop is the same. So:

- a shard whose computation dies leaves no progress entry: it is computed again (by the next
  attempt, or Ray's task retry) and its files are overwritten, never duplicated;
- a driver that dies leaves the progress file: the next attempt skips every recorded shard;
- a stop (the node is going away) stops the shards in flight at a model-call boundary, keeps
  every finished one and raises :class:`Interrupted`;
- a stall (no model call finished within the day's limit, inference/engine/watchdog.py) gives
  up on the shards in flight without waiting for them, keeps every finished one and raises
  :class:`Stalled`, an interruption the run's retry resumes from;
- on a pool that can copy shards and replace workers (Ray, with ``Watch.straggler_multiple``):
  the last shard in flight, once far slower than the day's median shard, gets a second copy on
  an idle worker and whichever finishes first is recorded, the other given up; a stall first
  replaces the stuck worker and hands its shards out again, once per shard, and counts the
  stall, before it fails the step.

Shards carry their own rows, so a shard may be any set of rows: a range of the input
(:func:`row_range_shards`), or every row of a set of accounts. Each row keeps its position in
the partition's input order, which is what the quarantine plan is keyed by.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from inference.engine.backstop import KillNote
from inference.engine.batching import Prefetcher, rebatch
from inference.engine.metrics import BatchMetrics
from inference.engine.observer import DayObserver, ShardSeen
from inference.engine.output_partition import ShardReport
from inference.engine.shard_worker import ShardInput, ShardJob, ShardResult, ShardStopped, StopCheck
from inference.engine.shard_writer import ShardedWriter
from inference.engine.watchdog import Stall, StallLimit, Watchdog

# Seconds between stop checks while the driver waits for the pool.
WAIT_SECONDS = 0.25

# Told after each shard this attempt records: (input rows read so far, of them rows of shards
# an earlier attempt finished, shards finished so far).
Progress = Callable[[int, int, int], None]


class Interrupted(Exception):
    """The node is being taken away: work stopped at a batch boundary, finished shards kept."""

    def __init__(self, reason: str, shards_done: int, rows_discarded: int, interruptions: int):
        super().__init__(
            f"interrupted ({reason}) with {shards_done} shards finished; "
            f"{rows_discarded} rows of the shards in flight will be redone on retry "
            f"(interruption {interruptions} of this partition)"
        )
        self.reason = reason
        self.shards_done = shards_done
        self.rows_discarded = rows_discarded
        self.interruptions = interruptions


class Stalled(Interrupted):
    """The day stopped moving: the stuck work was given up, finished shards kept."""

    def __init__(self, stall: Stall, where: str, shards_done: int, rows: int, interruptions: int):
        redone = (
            f"the stuck shard's {rows} rows will be redone on retry"
            if stall.shard is not None
            else "no shard had begun its model calls"
        )
        Exception.__init__(
            self,
            f"stalled: {stall.describe()} at {where}; the stuck work was stopped, "
            f"{shards_done} finished shards kept and {redone} "
            f"(interruption {interruptions} of this partition)",
        )
        self.reason = f"stalled: {stall.describe()}"
        self.stall = stall
        self.shards_done = shards_done
        self.rows_discarded = rows
        self.interruptions = interruptions


class ShardPool(Protocol):
    """Where shards are computed. ``slots``: shards handed out at once (their rows are held
    until they are done); ``read_ahead``: shards read on a thread beyond those;
    ``in_process``: whether shards run in this process."""

    slots: int
    read_ahead: int
    in_process: bool

    def submit(self, job: ShardJob, shard: ShardInput) -> Any: ...

    def wait(self, handles: list[Any], timeout: float) -> list[Any]: ...

    def result(self, handle: Any) -> ShardResult: ...

    def stop(self, handles: list[Any], abandon: bool = False) -> tuple[list[ShardResult], int]:
        """Stops the shards of ``handles``: the results of those that finished anyway, and
        the rows of work the others lose; with ``abandon`` (the day stalled), without waiting
        for the model calls in flight."""
        ...

    def watchdog(self, limit: StallLimit, note: KillNote | None = None) -> Watchdog:
        """The progress watchdog of the day about to run, fed by this pool's model calls;
        ``note``: where a backstop that kills the step says why (a pool whose model calls
        run in this process)."""
        ...


# The least time a shard runs before a straggler copy of it is started (Watch).
STRAGGLER_FLOOR_SECONDS = 30.0


@dataclass
class WorkerFigures:
    """What the workers did for one partition, for its metadata."""

    shards: dict[str, int] = field(default_factory=dict)  # worker -> shards computed
    peak_rss_mib: dict[str, float] = field(default_factory=dict)  # worker -> its peak RSS
    model_loads: dict[str, int] = field(default_factory=dict)  # worker -> models loaded so far
    rows_redone: int = 0
    shards_redone: int = 0

    def add(self, result: ShardResult) -> None:
        name = result.worker
        self.shards[name] = self.shards.get(name, 0) + 1
        self.peak_rss_mib[name] = max(self.peak_rss_mib.get(name, 0.0), result.peak_rss_mib)
        self.model_loads[name] = result.model_loads
        if result.rows_redone:
            self.rows_redone += result.rows_redone
            self.shards_redone += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "workers": len(self.shards),
            "worker_shards": dict(sorted(self.shards.items())),
            "worker_peak_rss_mib": round(max(self.peak_rss_mib.values(), default=0.0), 1),
            "worker_model_loads": sum(self.model_loads.values()),
            "shards_redone_by_workers": self.shards_redone,
        }


@dataclass
class Watch:
    """What the driver reports to and asks while it runs a partition.

    Args:
        stop: returns a reason when the node is going away; checked while waiting on shards.
        progress: told after each shard recorded.
        metrics: receives the read/preprocess/compute/write split and per-call timings.
        figures: what the workers did.
        watchdog: says when no model call finished for too long; asked with ``stop``.
        straggler_multiple: on a pool that can copy shards and replace workers (Ray), the
            last shard in flight gets a second copy on an idle worker once it has run this
            many times the day's median shard, and a stalled shard's worker is replaced and
            the shard handed out again (once) before the day fails; 0 turns both off.
        observer: told the day's live figures after each shard recorded (monitoring).
    """

    stop: StopCheck = lambda: None
    progress: Progress | None = None
    metrics: BatchMetrics = field(default_factory=BatchMetrics)
    figures: WorkerFigures = field(default_factory=WorkerFigures)
    watchdog: Watchdog | None = None
    straggler_multiple: float = 0.0
    # Nor before this long: a copy costs a fresh worker and its model load, which a shard of a
    # few seconds does not repay, and on a busy node such shards vary by more than the multiple.
    straggler_floor_s: float = STRAGGLER_FLOOR_SECONDS
    stalled_s: float = 0.0  # time lost to the stalls got past (the policy counts it)
    observer: DayObserver | None = None


def run_partition(
    writer: ShardedWriter,
    shards: Callable[[], Iterable[ShardInput]],
    job: ShardJob,
    pool: ShardPool,
    watch: Watch | None = None,
) -> ShardReport:
    """Computes a partition's shards on ``pool`` and commits it once every shard is recorded.

    ``shards`` is called after the writer's ``begin`` (staging is then settled) and read lazily:
    at most ``pool.slots`` shards' rows are held at once, so the next shard is read while one
    computes. Finished shards of an earlier attempt are skipped.

    Raises:
        Interrupted: ``watch.stop`` fired; the shards in flight were stopped, finished ones kept.
        Stalled: ``watch.watchdog`` found no model call finished within the day's limit; the
            shards in flight were given up, finished ones kept.
        RowConservationError: a model call answered for more or fewer rows than it was given;
            nothing is committed.
    """
    loop = _Loop(writer, pool, watch or Watch(), job.where)
    try:
        report = writer.begin()
        if report.already_committed:
            return report
        count = loop.run(shards(), job)
        reason = loop.watch.stop()
        if reason:
            raise loop.interrupted(reason, 0)
        return publish(writer, count, loop.watch.metrics)
    finally:
        loop.abandon()
        writer.close()


class _Loop:
    """The shards handed to the pool and not yet recorded, and the rows read so far."""

    def __init__(self, writer: ShardedWriter, pool: ShardPool, watch: Watch, where: str = ""):
        self.writer, self.pool, self.watch, self.where = writer, pool, watch, where
        self.pending: dict[Any, ShardInput] = {}
        self.rows_read = self.rows_resumed = 0
        self.job: ShardJob | None = None
        # A straggler and its copy, each to the other, and which of them are copies.
        self.twins: dict[Any, Any] = {}
        self.copies: set[Any] = set()
        self.copied: set[int] = set()  # shards copied once already
        self.redispatched: set[int] = set()  # shards handed out again after a stall
        self.shard_seconds: list[float] = []  # the day's shards, begun to back, as seen here
        multiple = self.watch.straggler_multiple
        self.redispatch = bool(multiple) and all(
            hasattr(pool, m) for m in ("copy", "drop", "replace", "running_for")
        )

    def run(self, shards: Iterable[ShardInput], job: ShardJob) -> int:
        """Hands out every shard not finished before; returns how many shards there are.

        With ``pool.read_ahead``, the next shards are read on a thread while the pool computes
        (a pool in this process computes on this thread); else each is read when a slot is free."""
        self.job = job
        reading = _each(shards)  # closed at the end, which closes a generator of shards too
        ahead = (
            iter(Prefetcher(reading, depth=self.pool.read_ahead))
            if self.pool.read_ahead
            else reading
        )
        with closing(ahead):
            count = self._hand_out(ahead, job)
        self.collect(block=True)
        return count

    def _hand_out(self, shards: Iterator[ShardInput], job: ShardJob) -> int:
        count = 0
        started = time.perf_counter()
        for shard in shards:
            count = max(count, shard.index + 1)
            if self.writer.done(shard.index):
                self.writer.report.shards_resumed += 1
                self.rows_read += shard.rows.num_rows
                self.rows_resumed += shard.rows.num_rows
                continue
            self.watch.metrics.add_phase("read", time.perf_counter() - started)
            if self.watch.watchdog is not None:
                self.watch.watchdog.heartbeat.handed_out()
            self.pending[self.pool.submit(job, shard)] = shard
            self.collect(block=False)
            started = time.perf_counter()
        return count

    def collect(self, block: bool) -> None:
        """Records finished shards: all of them (``block``), else until a slot is free."""
        while self.pending:
            reason = self.watch.stop()
            if reason:
                raise self.stop(reason)
            stall = self.watch.watchdog.stalled() if self.watch.watchdog is not None else None
            if stall is not None:
                if not self.replace_stalled(stall):
                    raise self.stalled(stall)
                continue
            if block:  # every shard is handed out: the last one may be a straggler
                self.copy_straggler()
            # Wait only when every slot is taken (or at the end); otherwise take what is ready
            # and go back to hand out the next shard.
            full = block or len(self.pending) >= self.pool.slots
            for handle in self.pool.wait(list(self.pending), WAIT_SECONDS if full else 0.0):
                if handle not in self.pending:  # the copy that lost, given up just now
                    continue
                took = self.pool.running_for(handle) if self.redispatch else None
                try:
                    result = self.pool.result(handle)
                except ShardStopped as stopped:  # the pool saw the stop first
                    self.pending.pop(handle)
                    raise self.stop(stopped.reason, stopped.rows_done) from None
                shard = self.pending.pop(handle)
                self.settle_twin(handle)
                if took is not None:
                    self.shard_seconds.append(took)
                self.record(shard, result)
            if not block and len(self.pending) < self.pool.slots:
                return

    def copy_straggler(self) -> None:
        """Starts a second copy of the one shard left in flight once it has run
        ``straggler_multiple`` times the day's median shard, on an idle worker; whichever
        finishes first is recorded (:meth:`settle_twin`)."""
        if not self.redispatch or len(self.pending) != 1 or not self.shard_seconds:
            return
        [(handle, shard)] = self.pending.items()
        running = self.pool.running_for(handle)
        limit = max(
            self.watch.straggler_multiple * statistics.median(self.shard_seconds),
            self.watch.straggler_floor_s,
        )
        if shard.index in self.copied or running is None or running < limit:
            return
        copy = self.pool.copy(self.job, shard, handle)
        if copy is None:  # no idle worker (a smaller pool than the shards in flight)
            return
        self.copied.add(shard.index)
        self.pending[copy] = shard
        self.twins[handle], self.twins[copy] = copy, handle
        self.copies.add(copy)
        self.writer.report.stragglers_copied += 1

    def settle_twin(self, handle: Any) -> None:
        """``handle`` finished first: its twin (the straggler or its copy) is given up, so
        the shard is recorded once; a twin that finished too is taken and thrown away."""
        other = self.twins.pop(handle, None)
        if other is None:
            return
        del self.twins[other]
        if handle in self.copies:
            self.writer.report.straggler_copy_won += 1
        self.copies -= {handle, other}
        self.pending.pop(other)
        if self.pool.wait([other], 0.0):
            with suppress(Exception):  # the result is not used: the shard is recorded
                self.pool.result(other)
            return
        self.hand_again(self.pool.drop(other))

    def replace_stalled(self, stall: Stall) -> bool:
        """Gets past a stall by replacing the stuck shard's worker and handing its shards out
        again, once per shard; False when that cannot be done (the step then fails)."""
        if not self.redispatch or stall.shard is None or stall.shard in self.redispatched:
            return False
        stuck = [h for h, s in self.pending.items() if s.index == stall.shard]
        if not stuck:
            return False
        self.redispatched.add(stall.shard)
        self.watch.stalled_s += stall.waited
        again = self.hand_again(self.pool.replace(stuck))
        self.writer.record_stall()
        if self.watch.watchdog is not None:
            # A fresh worker starts cold, as the day's first did: the ceiling holds until the
            # shards handed out again have begun.
            self.watch.watchdog.heartbeat.cold(again)
        return True

    def hand_again(self, handles: list[Any]) -> set[int]:
        """Hands out again the shards of ``handles``, which a replaced worker held (one whose
        twin still runs is left to it); returns those handed out."""
        again = set()
        for handle in handles:
            shard = self.pending.pop(handle, None)
            if shard is None:
                continue
            twin = self.twins.pop(handle, None)
            if twin is not None:
                del self.twins[twin]
                self.copies -= {handle, twin}
                continue
            self.pending[self.pool.submit(self.job, shard)] = shard
            again.add(shard.index)
        return again

    def record(self, shard: ShardInput, result: ShardResult) -> None:
        writer = self.writer
        if writer.done(result.index):  # never twice: the first result recorded is the shard
            return
        writer.report.rows_redone += result.rows_redone
        writer.record_shard(
            result.index, result.files, result.rows_in, result.stats, result.rows_scored
        )
        self.watch.metrics.merge(result.metrics)
        self.watch.figures.add(result)
        self.rows_read += shard.rows.num_rows
        if self.watch.progress is not None:
            self.watch.progress(self.rows_read, self.rows_resumed, len(writer.progress.shards))
        if self.watch.observer is not None:
            self.watch.observer.shard_done(
                ShardSeen(
                    self.rows_read,
                    self.rows_resumed,
                    len(writer.progress.shards),
                    len(self.pending),
                    writer.report.rows_redone,
                    writer.progress.interruptions,
                    self.watch.metrics,
                )
            )

    def stop(self, reason: str, rows_lost: int = 0) -> Interrupted:
        """Stops the shards in flight, records those that finished anyway, and says how far
        the partition got."""
        handles = list(self.pending)
        finished, lost = self.pool.stop(handles)
        by_index = {s.index: s for s in self.pending.values()}
        self.pending.clear()
        for result in sorted(finished, key=lambda r: r.index):
            self.record(by_index[result.index], result)
        return self.interrupted(reason, rows_lost + lost)

    def stalled(self, stall: Stall) -> Stalled:
        """Gives up on the shards in flight without waiting for them, records those that
        finished anyway, and says where the day stopped moving."""
        handles = list(self.pending)
        finished, _ = self.pool.stop(handles, abandon=True)
        # The stuck shard's rows are all redone (its marker says so to the retry); a shard
        # only started lost nothing.
        kept = {r.index for r in finished}
        lost = sum(
            s.rows.num_rows
            for s in self.pending.values()
            if s.index == stall.shard and s.index not in kept
        )
        by_index = {s.index: s for s in self.pending.values()}
        self.pending.clear()
        for result in sorted(finished, key=lambda r: r.index):
            self.record(by_index[result.index], result)
        writer = self.writer
        writer.record_interruption(lost, stalled=True)
        where = self.where or writer.target.uri(writer.target.data_dir())
        progress = writer.progress
        return Stalled(stall, where, len(progress.shards), lost, progress.interruptions)

    def interrupted(self, reason: str, rows_lost: int) -> Interrupted:
        writer = self.writer
        writer.record_interruption(rows_lost)
        return Interrupted(
            reason, len(writer.progress.shards), rows_lost, writer.progress.interruptions
        )

    def abandon(self) -> None:
        """After a failure: stops what is still in flight, so nothing writes into staging once
        the lease is released (the failure itself is what the caller sees)."""
        if self.pending:
            with suppress(Exception):
                self.pool.stop(list(self.pending))
            self.pending.clear()


def _each(items: Iterable[ShardInput]) -> Iterator[ShardInput]:
    yield from items


def publish(writer: ShardedWriter, shards: int, metrics: BatchMetrics) -> ShardReport:
    """Commits shards 0..shards-1; a partition with no rows is published as one empty file."""
    if shards == 0:
        writer.write_shard(0, [], 0)
        shards = 1
    started = time.perf_counter()
    writer.commit(shards)
    metrics.add_phase("write", time.perf_counter() - started)
    return writer.report


def row_range_shards(batches: Iterable[pa.RecordBatch], shard_rows: int) -> Iterator[ShardInput]:
    """The input cut into shards of ``shard_rows`` rows in input order (0: one shard)."""
    offset = 0
    for index, rows in enumerate(rebatch(batches, shard_rows or (1 << 62))):
        table = pa.Table.from_batches([rows])
        yield ShardInput(index, table, np.arange(offset, offset + rows.num_rows, dtype=np.int64))
        offset += rows.num_rows
