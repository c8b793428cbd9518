"""One shard computed where it runs: this process (the local pool) or a Ray actor.

A domain describes its scoring as a :data:`ShardProgram`: given the rows a shard will score
(quarantined rows already set aside) it returns the shard's :class:`ModelStep`, building
whatever the shard needs where it runs: the model (:func:`worker_model`, loaded once per process,
or the one the step already holds when shards run in the step's own process) and per-shard
state (the fraud profile of the shard's accounts). :func:`compute_shard` then cuts the shard into
model calls, checks each for row conservation, writes the shard's files to staging under their
fixed names and returns a :class:`ShardResult`; the driver records it (inference/engine/shards.py).

A marker (``_running/shard-NNNNN.json`` in staging) is written when a shard starts, so a shard
whose worker or driver was lost is known when it is computed again and its rows are counted as
redone. A graceful stop between model calls writes how many of the shard's rows it had done.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from inference.engine.batch_timeout import (
    BatchTimedOut,
    BatchTimeout,
    BatchTimeoutError,
    CallClock,
)
from inference.engine.faults import device_faults
from inference.engine.invariants import StreamStats
from inference.engine.metrics import BatchMetrics, peak_rss_mb
from inference.engine.output_partition import QUARANTINED_PREFIX, PartitionIO
from inference.engine.quarantine import REASON, QuarantinePlan, RowConservationError
from inference.engine.shard_writer import (
    ShardFiles,
    ShardFileTargets,
    shard_file_name,
    write_shard_files,
)
from inference.engine.watchdog import Heartbeat

RUNNING_DIR = "_running"
# Model calls prepared ahead of the model, and the threads preparing them: tokenising and
# assembling features release the GIL, so two can be prepared while the model runs.
PREPARE_AHEAD = 2
PREPARE_WORKERS = 2

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
# Adds the model's own measurements of the call just made to its shard's batch metrics.
Measure = Callable[[BatchMetrics], None]


@dataclass(frozen=True)
class ModelStep:
    """One shard's model step and what watches it.

    Args:
        transform: ``(batch, prepared) -> output rows``, one model call.
        prepare: CPU-side preparation of a call's rows, run ahead of the model on threads;
            ``prepared`` is the batch itself without it.
        count_out: input rows an output batch answers for (default: its row count).
        observe: adds each model call (rows scored, output) to the shard's statistics.
        observe_prepared: adds each call's prepared input to the shard's statistics.
        side: picks each call's side-output rows (the partition must have a side output).
        measure: adds what the model measured in the call just made (a generation model:
            each request's time to first token) to the shard's batch metrics, which come back
            with the shard from wherever it ran.
    """

    transform: Transform
    prepare: Prepare | None = None
    count_out: CountOut | None = None
    observe: Observe | None = None
    observe_prepared: ObservePrepared | None = None
    side: Side | None = None
    measure: Measure | None = None


# Builds a shard's model step from the rows it will score, where the shard runs.
ShardProgram = Callable[[pa.Table], ModelStep]


@dataclass(frozen=True)
class FixedProgram:
    """A program whose step does not depend on the shard (no per-key state, model in hand)."""

    step: ModelStep

    def __call__(self, rows: pa.Table) -> ModelStep:
        return self.step


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
    batch_timeout: BatchTimeout = BatchTimeout()  # per-call deadlines (off by default)


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


class ShardStopped(Exception):
    """A stop check fired between two model calls of a shard; its files were not written."""

    def __init__(self, reason: str, index: int, rows_done: int):
        super().__init__(f"shard {index} stopped ({reason}) after {rows_done} rows")
        self.reason, self.index, self.rows_done = reason, index, rows_done


# Models loaded by this worker process, by key: a worker loads each model once, whatever the
# number of shards or days it computes.
_MODELS: dict[str, Any] = {}
_LOADS: dict[str, int] = {}
# Where shards computed in the step's own process take their models from (the inference
# resource's cache, which already holds the step's model): set by the local pool.
_HOST = threading.local()

ModelSource = Callable[[str, Callable[[], Any]], Any]


@contextmanager
def hosting(source: ModelSource | None) -> Iterator[None]:
    """While it lasts, :func:`worker_model` on this thread asks ``source`` for models."""
    before = getattr(_HOST, "source", None)
    _HOST.source = source
    try:
        yield
    finally:
        _HOST.source = before


def worker_model(key: str, loader: Callable[[], Any]) -> Any:
    """The model under ``key`` where the shard runs: the step's own, in the step's process;
    else this worker process's, loaded on first use."""
    source = getattr(_HOST, "source", None)
    if source is not None:
        return source(key, loader)
    if key not in _MODELS:
        _MODELS[key] = loader()
        _LOADS[key] = _LOADS.get(key, 0) + 1
    return _MODELS[key]


def worker_loads() -> int:
    """Model loads in this worker process so far."""
    return sum(_LOADS.values())


@dataclass
class _Outputs:
    """What one shard's model calls produced so far."""

    tables: list[pa.Table]
    side: list[pa.Table]
    stats: StreamStats
    metrics: BatchMetrics
    rows_done: int = 0


def compute_shard(
    job: ShardJob,
    shard: ShardInput,
    stop: StopCheck | None = None,
    heartbeat: Heartbeat | None = None,
) -> ShardResult:
    """Computes one shard and writes its files to staging; ``heartbeat`` is told as each
    model call finishes.

    Raises:
        ShardStopped: ``stop`` fired before a model call; the marker records the rows done.
        RowConservationError: a model call answered for more or fewer rows than it was given.
    """
    return StartedShard(job, shard).finish(stop, heartbeat)


class StartedShard:
    """A shard whose model calls can begin: its quarantined rows set aside, its step built by
    the program and its first calls prepared.

    Starting touches no storage, so a pool may start the next shard on a thread while this
    one's model calls run (:class:`inference.engine.local_pool.LocalPool`): a shard started and
    never finished has cost nothing a retry must redo. :meth:`finish` runs the model calls."""

    def __init__(self, job: ShardJob, shard: ShardInput):
        self.job, self.shard = job, shard
        self.done = _Outputs([], [], StreamStats(), BatchMetrics())
        self.good, self.held = _split(job.quarantine, shard.rows, shard.positions)
        if self.held is not None:
            for why, n in Counter(self.held.column(REASON).to_pylist()).items():
                self.done.stats.count(f"{QUARANTINED_PREFIX}{why}", n)
        self.step = job.program(self.good) if self.good.num_rows else None
        self._calls: Iterator | None = None
        self._first: tuple | None = None
        if self.step is not None:
            self._calls = _prepared(self.step, _model_calls(job, shard), self.done.metrics)
            # The first call's preparation waited for here, where the shard is started.
            self._first = next(self._calls, None)

    def finish(
        self, stop: StopCheck | None = None, heartbeat: Heartbeat | None = None
    ) -> ShardResult:
        """Runs the shard's model calls on this thread and writes its files to staging;
        ``heartbeat`` is told as each call finishes (the progress watchdog's)."""
        job, shard, done = self.job, self.shard, self.done
        if heartbeat is not None:
            heartbeat.shard_started(shard.index)
        io = PartitionIO(job.files.target)
        marker = f"{job.files.target.staging_dir}/{RUNNING_DIR}/{shard_file_name(shard.index)}.json"
        redone = _rows_redone(io, marker, shard.rows.num_rows)
        io.mkdir(f"{job.files.target.staging_dir}/{RUNNING_DIR}")
        io.write_json(
            marker, {"shard": shard.index, "rows": shard.rows.num_rows, "worker": _worker_name()}
        )
        try:
            if self.step is not None:
                calls = self._started_calls()
                _score_calls(job, shard, self.step, calls, done, stop, heartbeat)
        except ShardStopped:
            # Only the rows done count as redone on the retry: none done, nothing to redo.
            io.write_json(marker, {"shard": shard.index, "rows_discarded": done.rows_done})
            raise
        finally:
            self.close()
        started = time.perf_counter()
        files = write_shard_files(
            job.files, shard.index, done.tables, [self.held] if self.held else [], done.side
        )
        done.metrics.add_phase("write", time.perf_counter() - started)
        return ShardResult(
            shard.index,
            files,
            shard.rows.num_rows,
            self.good.num_rows,
            done.stats,
            redone,
            done.metrics,
            _worker_name(),
            peak_rss_mb(),
            worker_loads(),
        )

    def _started_calls(self) -> Iterator[tuple[int, pa.RecordBatch | None, Any]]:
        if self._first is not None:
            yield self._first
        if self._calls is not None:
            yield from self._calls

    def close(self) -> None:
        """Stops the preparation threads of a shard that will not be finished."""
        if self._calls is not None:
            self._calls.close()


def _rows_redone(io: PartitionIO, marker: str, rows: int) -> int:
    """Rows an earlier start of this shard cost: as its graceful stop recorded them, else all
    of them (a worker or driver lost without notice)."""
    if not io.exists(marker):
        return 0
    left = io.read_json(marker) or {}
    return int(left.get("rows_discarded", rows))


def _score_calls(
    job: ShardJob,
    shard: ShardInput,
    step: ModelStep,
    calls: Iterator[tuple[int, pa.RecordBatch | None, Any]],
    done: _Outputs,
    stop: StopCheck | None,
    heartbeat: Heartbeat | None = None,
) -> None:
    """The shard's model calls (each prepared ahead) in order, checked and observed."""
    clock = CallClock()
    try:
        for count, (rows_in, batch, prepared) in enumerate(calls, start=1):
            reason = stop() if stop is not None else None
            if reason:
                raise ShardStopped(reason, shard.index, done.rows_done)
            if batch is not None:
                moved = _moved(heartbeat, shard.index, count - 1)
                out = _TimedCall(job, shard.index, step, done, clock, moved).score(batch, prepared)
                if step.observe is not None:
                    step.observe(batch, out, done.stats)
                if step.observe_prepared is not None:
                    step.observe_prepared(prepared, done.stats)
                done.tables.append(out)
                if step.side is not None:
                    done.side.append(step.side(batch, out))
            done.rows_done += rows_in
            if heartbeat is not None:
                seconds = done.metrics.batch_seconds[-1] if batch is not None else None
                heartbeat.beat(shard.index, count, seconds)
    finally:
        clock.close()


def _moved(heartbeat: Heartbeat | None, shard: int, batches: int) -> Callable[[], None]:
    """Tells the progress watchdog that a call timed out or a part of a split call finished:
    the shard is not stuck (a deadline's retries and splits end, at the latest, at a single
    row), though no whole call has finished. No call time is given: a part's is not a call's."""
    if heartbeat is None:
        return lambda: None
    return lambda: heartbeat.beat(shard, batches, None)


@dataclass
class _TimedCall:
    """One model call under the job's deadline: a call past it is tried once more, then its
    rows are split in halves, each scored the same way, down to a single row; a single row
    past its deadline twice fails the shard."""

    job: ShardJob
    shard: int
    step: ModelStep
    done: _Outputs
    clock: CallClock
    moved: Callable[[], None]

    def score(self, batch: pa.RecordBatch, prepared: Any) -> pa.Table:
        metrics = self.done.metrics
        for _ in range(2):
            deadline = self.job.batch_timeout.deadline(metrics.batch_seconds)
            try:
                return self.clock.call(
                    lambda: score_batch(
                        batch, prepared, self.step, metrics, self.job.where, self.shard
                    ),
                    deadline,
                )
            except BatchTimedOut:
                metrics.batch_timeouts += 1
                self.moved()
        if batch.num_rows == 1:
            raise BatchTimeoutError(
                f"{self.job.where}: a model call of a single row (shard {self.shard}) ran past "
                f"its deadline of {deadline:.3g} s ({self.job.batch_timeout.multiple:g}x the "
                "shard's median call) twice; its input is slow alone, so splitting cannot "
                "help and nothing was committed"
            )
        metrics.batch_splits += 1
        half = batch.num_rows // 2
        parts = [batch.slice(0, half), batch.slice(half)]
        scored = []
        for part in parts:
            scored.append(self.score(part, self._prepare(part)))
            self.moved()
        return pa.concat_tables(scored)

    def _prepare(self, part: pa.RecordBatch) -> Any:
        if self.step.prepare is None:
            return part
        started = time.perf_counter()
        prepared = self.step.prepare(part)
        self.done.metrics.add_phase("preprocess", time.perf_counter() - started)
        return prepared


def score_batch(
    good: pa.RecordBatch,
    prepared: Any,
    step: ModelStep,
    metrics: BatchMetrics,
    where: str,
    shard: int,
) -> pa.Table:
    """Runs the model step on one batch and checks it answered for exactly its rows."""
    started = time.perf_counter()
    with device_faults(shard, good.num_rows):
        out = step.transform(good, prepared)
    elapsed = time.perf_counter() - started
    out = out if isinstance(out, pa.Table) else pa.Table.from_batches([out])
    answered = step.count_out(out) if step.count_out else out.num_rows
    if answered != good.num_rows:
        raise RowConservationError(
            f"{where}: the model step answered for {answered} rows but was given "
            f"{good.num_rows} (shard {shard}); a model call must never drop or add rows, "
            "so nothing was committed"
        )
    metrics.record_batch(good.num_rows, out.num_rows, elapsed)
    metrics.add_phase("compute", elapsed)
    if step.measure is not None:
        step.measure(metrics)
    return out


Call = tuple[int, pa.RecordBatch | None]


def _model_calls(job: ShardJob, shard: ShardInput) -> Iterator[Call]:
    """The shard's input in model calls of ``batch_size`` input rows: (input rows, the rows to
    score or None). Calls are cut before quarantined rows are set aside, so the same rows
    share a call wherever the shard runs."""
    size = job.batch_size
    for start in range(0, shard.rows.num_rows, size):
        rows = shard.rows.slice(start, size)
        good, _ = _split(job.quarantine, rows, shard.positions[start : start + size])
        batch = good.combine_chunks().to_batches()[0] if good.num_rows else None
        yield rows.num_rows, batch


def _prepared(
    step: ModelStep, calls: Iterator[Call], metrics: BatchMetrics
) -> Iterator[tuple[int, pa.RecordBatch | None, Any]]:
    """``calls`` with each batch prepared, :data:`PREPARE_AHEAD` calls ahead on
    :data:`PREPARE_WORKERS` threads, in input order."""
    if step.prepare is None:
        for rows_in, batch in calls:
            yield rows_in, batch, batch
        return
    threads = ThreadPoolExecutor(PREPARE_WORKERS, thread_name_prefix="nightshift-prepare")
    ahead: deque[tuple[int, pa.RecordBatch | None, Future]] = deque()
    try:
        for rows_in, batch in calls:
            ahead.append((rows_in, batch, _submit(threads, step.prepare, batch)))
            if len(ahead) > PREPARE_AHEAD:
                yield _take(ahead, metrics)
        while ahead:
            yield _take(ahead, metrics)
    finally:
        threads.shutdown(wait=True, cancel_futures=True)


def _submit(threads: ThreadPoolExecutor, prepare: Prepare, batch: pa.RecordBatch | None) -> Future:
    if batch is None:
        ready: Future = Future()
        ready.set_result((None, 0.0))
        return ready
    return threads.submit(_timed, prepare, batch)


def _take(ahead: deque, metrics: BatchMetrics) -> tuple[int, pa.RecordBatch | None, Any]:
    metrics.observe_queue_depth(sum(f.done() for _, _, f in ahead))
    rows_in, batch, future = ahead.popleft()
    prepared, seconds = future.result()
    metrics.add_phase("preprocess", seconds)
    return rows_in, batch, prepared


def _timed(prepare: Prepare, batch: pa.RecordBatch) -> tuple[Any, float]:
    started = time.perf_counter()
    return prepare(batch), time.perf_counter() - started


def _split(
    plan: QuarantinePlan | None, rows: pa.Table, positions: np.ndarray
) -> tuple[pa.Table, pa.Table | None]:
    return plan.split_at(rows, positions) if plan is not None else (rows, None)


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
