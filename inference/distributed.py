"""Shards computed by workers (Ray actors, or this process) and recorded by the driver.

The driver, the Dagster step, keeps what makes a partition exactly once: the lease, the
progress file and the commit (:class:`~inference.shard_writer.ShardedWriter`). It cuts the
partition into :class:`ShardInput` s, and a pool hands each one to a worker. The worker computes
the shard with the :class:`ShardJob` it was given once (the model is loaded once per worker),
writes the shard's files to staging under their fixed names and returns a :class:`ShardResult`;
only then does the driver record the shard. So:

- a worker that dies mid-shard leaves no progress entry: the shard is computed again (by Ray's
  task retry, or by the next attempt) and its files are overwritten, never duplicated;
- a driver that dies leaves the progress file: the next attempt skips every recorded shard;
- a shard started before is known by its marker (``_running/shard-NNNNN.json`` in staging), so
  the rows a lost worker or driver cost are counted as ``rows_redone``.

Shards here carry their own rows, so a shard may be any set of rows: a range of the input, or
every row of a set of accounts (per-key state then stays inside the shard). Each row keeps its
position in the partition's input order, which is what the quarantine plan is keyed by.
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from inference.batching import rebatch
from inference.invariants import StreamStats
from inference.metrics import BatchMetrics
from inference.output_partition import QUARANTINED_PREFIX, ShardReport
from inference.partition_io import PartitionIO
from inference.quarantine import REASON, QuarantinePlan
from inference.shard_writer import (
    ShardedWriter,
    ShardFiles,
    ShardFileTargets,
    shard_file_name,
    write_shard_files,
)
from inference.shards import (
    CountOut,
    Interrupted,
    Observe,
    ObservePrepared,
    Side,
    publish,
    score_batch,
)

RUNNING_DIR = "_running"
# Seconds between stop checks while the driver waits for workers.
WAIT_SECONDS = 0.25


@dataclass
class ShardFunctions:
    """The model step of one shard, as in :func:`inference.shards.run_sharded`."""

    transform: Callable[[pa.RecordBatch, Any], pa.Table | pa.RecordBatch]
    prepare: Callable[[pa.RecordBatch], Any] | None = None
    observe: Observe | None = None
    count_out: CountOut | None = None
    side: Side | None = None
    observe_prepared: ObservePrepared | None = None


# Builds a shard's functions from the rows it will score (quarantined rows already set aside):
# per-shard state (the fraud profile of the shard's accounts) is built here, in the worker.
ShardProgram = Callable[[pa.Table], ShardFunctions]


@dataclass(frozen=True)
class FixedProgram:
    """A program whose functions do not depend on the shard (no per-key state)."""

    functions: ShardFunctions

    def __call__(self, rows: pa.Table) -> ShardFunctions:
        return self.functions


@dataclass(frozen=True)
class ShardInput:
    """One shard's input rows and each row's position in the partition's input order."""

    index: int
    rows: pa.Table
    positions: np.ndarray


@dataclass(frozen=True)
class ShardJob:
    """What every worker needs besides a shard's rows; sent to each worker once."""

    files: ShardFileTargets
    program: ShardProgram
    batch_size: int
    quarantine: QuarantinePlan | None = None
    where: str = ""  # the partition's final location, for error messages


@dataclass
class ShardResult:
    """One shard computed and written by a worker: what its progress entry records."""

    index: int
    files: ShardFiles
    rows_in: int
    rows_scored: int
    stats: StreamStats
    rows_redone: int
    metrics: BatchMetrics
    worker: str
    peak_rss_mib: float
    model_loads: int


# Models loaded by this worker process, by key: a worker loads each model once, whatever the
# number of shards or days it computes.
_MODELS: dict[str, Any] = {}
_LOADS: dict[str, int] = {}


def worker_model(key: str, loader: Callable[[], Any]) -> Any:
    """The model under ``key`` in this worker process, loaded on first use."""
    if key not in _MODELS:
        _MODELS[key] = loader()
        _LOADS[key] = _LOADS.get(key, 0) + 1
    return _MODELS[key]


def worker_loads() -> int:
    """Model loads in this worker process so far."""
    return sum(_LOADS.values())


def peak_rss_mib() -> float:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def compute_shard(job: ShardJob, shard: ShardInput) -> ShardResult:
    """Computes one shard and writes its files to staging (runs in the worker)."""
    io = PartitionIO(job.files.target)
    marker = f"{job.files.target.staging_dir}/{RUNNING_DIR}/{shard_file_name(shard.index)}.json"
    # A marker left by an earlier start means a worker (or driver) was lost with this shard.
    redone = shard.rows.num_rows if io.exists(marker) else 0
    io.mkdir(f"{job.files.target.staging_dir}/{RUNNING_DIR}")
    io.write_json(
        marker, {"shard": shard.index, "rows": shard.rows.num_rows, "worker": _worker_name()}
    )
    metrics, stats = BatchMetrics(), StreamStats()
    good, held = _split(job.quarantine, shard.rows, shard.positions)
    if held is not None:
        for why, n in Counter(held.column(REASON).to_pylist()).items():
            stats.count(f"{QUARANTINED_PREFIX}{why}", n)
    outputs: list[pa.Table] = []
    side: list[pa.Table] = []
    functions = job.program(good) if good.num_rows else None
    for batch in _model_calls(job, shard) if functions else ():
        started = time.perf_counter()
        prepared = functions.prepare(batch) if functions.prepare else batch
        metrics.add_phase("preprocess", time.perf_counter() - started)
        out = score_batch(
            batch,
            prepared,
            functions.transform,
            metrics,
            functions.count_out,
            job.where,
            shard.index,
        )
        if functions.observe is not None:
            functions.observe(batch, out, stats)
        if functions.observe_prepared is not None:
            functions.observe_prepared(prepared, stats)
        outputs.append(out)
        if functions.side is not None:
            side.append(functions.side(batch, out))
    started = time.perf_counter()
    files = write_shard_files(job.files, shard.index, outputs, [held] if held else [], side)
    metrics.add_phase("write", time.perf_counter() - started)
    return ShardResult(
        shard.index,
        files,
        shard.rows.num_rows,
        good.num_rows,
        stats,
        redone,
        metrics,
        _worker_name(),
        peak_rss_mib(),
        worker_loads(),
    )


def _model_calls(job: ShardJob, shard: ShardInput) -> Iterator[pa.RecordBatch]:
    """The shard's rows to score, in model calls cut before quarantined rows are set aside (as
    the local engine cuts them), so the same rows share a call under both executors."""
    size = job.batch_size
    for start in range(0, shard.rows.num_rows, size):
        rows = shard.rows.slice(start, size)
        good, _ = _split(job.quarantine, rows, shard.positions[start : start + size])
        if good.num_rows:
            yield from good.combine_chunks().to_batches()


def _split(
    plan: QuarantinePlan | None, rows: pa.Table, positions: np.ndarray
) -> tuple[pa.Table, pa.Table | None]:
    return plan.split_at(rows, positions) if plan is not None else (rows, None)


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class ShardPool(Protocol):
    """Where shards are computed: :class:`InlinePool` (this process) or a Ray pool."""

    slots: int

    def submit(self, job: ShardJob, shard: ShardInput) -> Any: ...

    def wait(self, handles: list[Any], timeout: float) -> list[Any]: ...

    def result(self, handle: Any) -> ShardResult: ...

    def cancel(self, handles: list[Any]) -> None: ...


class InlinePool:
    """Computes each shard in this process, as a worker would: the reference for the others."""

    slots = 1

    def __init__(self) -> None:
        self._done: dict[int, ShardResult] = {}
        self._next = 0

    def submit(self, job: ShardJob, shard: ShardInput) -> int:
        handle, self._next = self._next, self._next + 1
        self._done[handle] = compute_shard(job, shard)
        return handle

    def wait(self, handles: list[Any], timeout: float) -> list[Any]:
        return list(handles)

    def result(self, handle: int) -> ShardResult:
        return self._done.pop(handle)

    def cancel(self, handles: list[Any]) -> None:
        for handle in handles:
            self._done.pop(handle, None)


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


def run_distributed(
    writer: ShardedWriter,
    shards: Callable[[], Iterable[ShardInput]],
    job: ShardJob,
    pool: ShardPool,
    *,
    stop: Callable[[], str | None] = lambda: None,
    metrics: BatchMetrics | None = None,
    progress: Callable[[int, int, int], None] | None = None,
    figures: WorkerFigures | None = None,
) -> ShardReport:
    """Computes a partition's shards on ``pool`` and commits it once every shard is recorded.

    ``shards`` is called after the writer's ``begin`` (staging is then settled), and read lazily:
    at most ``pool.slots`` shards' rows are in flight. Finished shards of an earlier attempt
    are skipped. On ``stop`` the shards in flight are cancelled and :class:`Interrupted` raised.
    """
    metrics = metrics or BatchMetrics()
    figures = figures if figures is not None else WorkerFigures()
    try:
        report = writer.begin()
        if report.already_committed:
            return report
        pending: dict[Any, ShardInput] = {}
        count = rows_read = rows_resumed = 0

        def collect(block: bool) -> None:
            nonlocal rows_read
            while pending:
                reason = stop()
                if reason:
                    pool.cancel(list(pending))
                    rows = sum(s.rows.num_rows for s in pending.values())
                    writer.record_interruption(None, rows)
                    raise Interrupted(
                        reason, len(writer.progress.shards), rows, writer.progress.interruptions
                    )
                # Wait only when every slot is taken (or at the end); otherwise take what is
                # ready and go back to hand out the next shard.
                full = block or len(pending) >= pool.slots
                done = pool.wait(list(pending), WAIT_SECONDS if full else 0.0)
                for handle in done:
                    shard = pending.pop(handle)
                    result = pool.result(handle)
                    writer.report.rows_redone += result.rows_redone
                    writer.record_shard(
                        result.index, result.files, result.rows_in, result.stats, result.rows_scored
                    )
                    metrics.merge(result.metrics)
                    figures.add(result)
                    rows_read += shard.rows.num_rows
                    if progress is not None:
                        progress(rows_read, rows_resumed, len(writer.progress.shards))
                if not block and len(pending) < pool.slots:
                    return

        started = time.perf_counter()
        for shard in shards():
            count = max(count, shard.index + 1)
            if writer.done(shard.index):
                report.shards_resumed += 1
                rows_read += shard.rows.num_rows
                rows_resumed += shard.rows.num_rows
                continue
            metrics.add_phase("read", time.perf_counter() - started)
            pending[pool.submit(job, shard)] = shard
            collect(block=False)
            started = time.perf_counter()
        collect(block=True)
        reason = stop()
        if reason:
            writer.record_interruption(None, 0)
            raise Interrupted(reason, len(writer.progress.shards), 0, writer.progress.interruptions)
        return publish(writer, count, metrics)
    finally:
        writer.close()


def row_range_shards(batches: Iterable[pa.RecordBatch], shard_rows: int) -> Iterator[ShardInput]:
    """The input cut into shards of ``shard_rows`` rows in input order (as the local engine)."""
    offset = 0
    for index, rows in enumerate(rebatch(batches, shard_rows or (1 << 62))):
        table = pa.Table.from_batches([rows])
        yield ShardInput(index, table, np.arange(offset, offset + rows.num_rows, dtype=np.int64))
        offset += rows.num_rows
