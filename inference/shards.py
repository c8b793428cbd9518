"""Sharded, checkpointed execution of one output partition, published exactly once.

A partition's input is cut into shards of ``shard_rows`` rows in input order; each shard is cut
into model batches. Finished shards are checkpointed by a :class:`ShardedWriter` (see
``inference.shard_writer``): a retry skips them and redoes at most the shard that was in
flight, and the partition is committed once every shard is present.

Rows a quarantine plan sets aside never reach the model; they are written with their shard and
published to the asset's quarantine partition in the same commit. Every model call is checked
for row conservation before its rows can reach a shard, and its exact statistics are kept with
the shard's checkpoint.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from inference.batching import Prefetcher, rebatch
from inference.invariants import StreamStats
from inference.metrics import BatchMetrics
from inference.output_partition import (
    MANIFEST,
    PROGRESS,
    QUARANTINE_DIR,
    QUARANTINED_PREFIX,
    PartitionTarget,
    ShardReport,
    fingerprint,
    input_fingerprint,
)
from inference.quarantine import REASON, QuarantinePlan, RowConservationError
from inference.shard_writer import ShardedWriter

__all__ = [
    "MANIFEST",
    "PROGRESS",
    "QUARANTINE_DIR",
    "QUARANTINED_PREFIX",
    "CountOut",
    "Interrupted",
    "Observe",
    "ObservePrepared",
    "PartitionTarget",
    "Progress",
    "ShardReport",
    "Side",
    "ShardedWriter",
    "fingerprint",
    "input_fingerprint",
    "publish",
    "run_sharded",
    "score_batch",
]


class Interrupted(Exception):
    """The node is being taken away: work stopped at a batch boundary, finished shards kept."""

    def __init__(self, reason: str, shards_done: int, rows_discarded: int, interruptions: int):
        super().__init__(
            f"interrupted ({reason}) with {shards_done} shards finished; "
            f"{rows_discarded} rows of the shard in flight will be redone on retry "
            f"(interruption {interruptions} of this partition)"
        )
        self.reason = reason
        self.shards_done = shards_done
        self.rows_discarded = rows_discarded
        self.interruptions = interruptions


Transform = Callable[[pa.RecordBatch, Any], pa.Table | pa.RecordBatch]
Prepare = Callable[[pa.RecordBatch], Any]
StopCheck = Callable[[], str | None]
# Adds one model call's exact statistics (rows scored, their output) to its shard's.
Observe = Callable[[pa.RecordBatch, pa.Table, StreamStats], None]
# How many input rows an output batch answers for (recommendations: distinct users).
CountOut = Callable[[pa.Table], int]
# Adds what preparing one model call's rows found (e.g. features clamped) to its shard's stats.
ObservePrepared = Callable[[Any, StreamStats], None]
# The side-output rows of one model call (rows scored, their output), committed with the shard.
Side = Callable[[pa.RecordBatch, pa.Table], pa.Table]
# Told after each shard this attempt writes: (input rows read so far, of them rows of shards an
# earlier attempt finished, shards finished so far).
Progress = Callable[[int, int, int], None]


@dataclass
class _Shard:
    """The shard being computed: its outputs, quarantined rows and statistics so far."""

    index: int
    outputs: list[pa.Table] = field(default_factory=list)
    quarantined: list[pa.Table] = field(default_factory=list)
    side: list[pa.Table] = field(default_factory=list)
    stats: StreamStats = field(default_factory=StreamStats)
    rows_in: int = 0
    rows_scored: int = 0


def run_sharded(
    writer: ShardedWriter,
    batches: Iterable[pa.RecordBatch],
    transform: Transform,
    *,
    batch_size: int,
    prepare: Prepare | None = None,
    stop: StopCheck = lambda: None,
    metrics: BatchMetrics | None = None,
    prefetch_depth: int = 2,
    prepare_workers: int = 2,
    quarantine: QuarantinePlan | None = None,
    observe: Observe | None = None,
    count_out: CountOut | None = None,
    progress: Progress | None = None,
    side: Side | None = None,
    observe_prepared: ObservePrepared | None = None,
) -> ShardReport:
    """Runs the model over the input in shards and commits the partition.

    Reading runs in a background thread, ``prefetch_depth`` batches ahead of the model, and
    ``prepare`` (tokenising, assembling features) on ``prepare_workers`` threads, so two
    batches can be prepared at once while the model runs (Arrow, numpy and tokenizers release
    the GIL); results come back in input order. Batches of finished shards are read but
    neither prepared nor computed.

    Args:
        writer: the partition's writer (``begin`` is called here).
        batches: the input as record batches, in a deterministic order.
        transform: the model step: ``(batch, prepared) -> output rows``.
        batch_size: rows per model call.
        prepare: CPU-side preparation of one batch; ``prepared`` is the batch itself without it.
        stop: returns a reason when the node is going away; checked before every batch.
        metrics: receives per-batch timings and the read/preprocess/compute/write split.
        prefetch_depth: batches read and prepared ahead.
        prepare_workers: threads preparing batches.
        quarantine: rows to set aside instead of scoring; the model never sees them.
        observe: adds each model call (rows scored, output) to its shard's statistics.
        count_out: input rows an output batch answers for (default: its row count).
        progress: told after each shard written: the input rows read so far, how many of them
            belong to shards an earlier attempt finished, and the shards finished so far.
        side: picks each model call's side-output rows (the writer must have a side target).
        observe_prepared: adds each model call's prepared input to its shard's statistics.

    Raises:
        Interrupted: ``stop`` fired; finished shards are kept for the retry.
        RowConservationError: the model step answered for more or fewer rows than it was
            given; nothing is committed.
    """
    metrics = metrics or BatchMetrics()
    workers = ThreadPoolExecutor(max(1, prepare_workers), thread_name_prefix="nightshift-prepare")

    def staged():
        # Shards are cut by input rows, then each into model batches: a batch never spans two
        # shards, and a different batch size on the retry does not invalidate the progress.
        offset = 0
        for shard, rows in enumerate(rebatch(batches, writer.shard_rows or (1 << 62))):
            for batch in rebatch([rows], batch_size):
                start, offset = offset, offset + batch.num_rows
                if writer.done(shard):
                    yield shard, batch, None, None, _ready(None, 0.0)
                    continue
                started = time.perf_counter()
                good, held = quarantine.split(batch, start) if quarantine else (batch, None)
                split = time.perf_counter() - started
                if prepare and good.num_rows:
                    yield shard, batch, good, held, workers.submit(_timed, prepare, good, split)
                else:
                    yield shard, batch, good, held, _ready(good, split)

    def interrupt(reason: str, shard: int | None, rows: int) -> Interrupted:
        writer.record_interruption(shard, rows)
        return Interrupted(reason, len(writer.progress.shards), rows, writer.progress.interruptions)

    try:
        # Inside the try: a begin that fails after taking the lease (no space left for the
        # progress file) must still release it, or the next run waits for it to expire.
        report = writer.begin()
        if report.already_committed:
            return report
        source = Prefetcher(staged(), depth=prefetch_depth)
        current: _Shard | None = None
        shards = rows_read = rows_resumed = 0

        def finish(shard: _Shard) -> None:
            _finish_shard(writer, shard, metrics)
            if progress is not None:
                progress(rows_read, rows_resumed, len(writer.progress.shards))

        clock = time.perf_counter()
        for shard, batch, good, held, preparing in source:
            prepared, prep_seconds = preparing.result()
            metrics.add_phase("read", time.perf_counter() - clock)
            metrics.add_phase("preprocess", prep_seconds)
            metrics.observe_queue_depth(source.depth)
            if current is None or shard != current.index:
                if current is not None and not writer.done(current.index):
                    finish(current)
                current, shards = _Shard(shard), shard + 1
                if writer.done(shard):
                    report.shards_resumed += 1
                else:
                    writer.start_shard(shard)
            if writer.done(shard):
                rows_read += batch.num_rows
                rows_resumed += batch.num_rows
                clock = time.perf_counter()
                continue
            reason = stop()
            if reason:
                raise interrupt(reason, shard, current.rows_in)
            if held is not None:
                current.quarantined.append(held)
                for why, n in Counter(held.column(REASON).to_pylist()).items():
                    current.stats.count(f"{QUARANTINED_PREFIX}{why}", n)
            if good.num_rows:
                _score(
                    current, good, prepared, transform, metrics, writer, observe, count_out, side
                )
                if observe_prepared is not None:
                    observe_prepared(prepared, current.stats)
            current.rows_in += batch.num_rows
            rows_read += batch.num_rows
            clock = time.perf_counter()
        if current is not None and not writer.done(current.index):
            finish(current)
        reason = stop()
        if reason:
            raise interrupt(reason, None, 0)
        return publish(writer, shards, metrics)
    finally:
        workers.shutdown(wait=True, cancel_futures=True)
        writer.close()


def publish(writer: ShardedWriter, shards: int, metrics: BatchMetrics) -> ShardReport:
    """Commits shards 0..shards-1; a partition with no rows is published as one empty file."""
    if shards == 0:
        writer.write_shard(0, [], 0)
        shards = 1
    started = time.perf_counter()
    writer.commit(shards)
    metrics.add_phase("write", time.perf_counter() - started)
    return writer.report


def _timed(prepare: Prepare, good: pa.RecordBatch, seconds: float) -> tuple[Any, float]:
    started = time.perf_counter()
    prepared = prepare(good)
    return prepared, seconds + time.perf_counter() - started


def _ready(prepared: Any, seconds: float) -> Future:
    done: Future = Future()
    done.set_result((prepared, seconds))
    return done


def _score(
    shard: _Shard,
    good: pa.RecordBatch,
    prepared: Any,
    transform: Transform,
    metrics: BatchMetrics,
    writer: ShardedWriter,
    observe: Observe | None,
    count_out: CountOut | None,
    side: Side | None,
) -> None:
    """One model call, checked for row conservation before its rows can reach a shard."""
    where = writer.target.uri(writer.target.final_dir)
    out = score_batch(good, prepared, transform, metrics, count_out, where, shard.index)
    if observe is not None:
        observe(good, out, shard.stats)
    shard.outputs.append(out)
    if side is not None:
        shard.side.append(side(good, out))
    shard.rows_scored += good.num_rows


def score_batch(
    good: pa.RecordBatch,
    prepared: Any,
    transform: Transform,
    metrics: BatchMetrics,
    count_out: CountOut | None,
    where: str,
    shard: int,
) -> pa.Table:
    """Runs the model step on one batch and checks it answered for exactly its rows."""
    started = time.perf_counter()
    out = transform(good, prepared)
    elapsed = time.perf_counter() - started
    out = out if isinstance(out, pa.Table) else pa.Table.from_batches([out])
    answered = count_out(out) if count_out else out.num_rows
    if answered != good.num_rows:
        raise RowConservationError(
            f"{where}: the model step answered for {answered} rows but was given "
            f"{good.num_rows} (shard {shard}); a model call must never drop or add rows, "
            "so nothing was committed"
        )
    metrics.record_batch(good.num_rows, out.num_rows, elapsed)
    metrics.add_phase("compute", elapsed)
    return out


def _finish_shard(writer: ShardedWriter, shard: _Shard, metrics: BatchMetrics) -> None:
    started = time.perf_counter()
    writer.write_shard(
        shard.index,
        shard.outputs,
        shard.rows_in,
        quarantined=shard.quarantined,
        stats=shard.stats,
        rows_scored=shard.rows_scored,
        side=shard.side,
    )
    metrics.add_phase("write", time.perf_counter() - started)
