"""Shards computed in the step's own process (the ``local`` executor).

Each shard's model calls run on the step's own thread, where signals are handled, so an
interruption is seen at the next model call. What comes before a shard's first model call (its
program: the fraud profile of its accounts; and its first calls' preparation) runs on a thread
of the pool's while the shard before it is scored, so on a day of many shards the model is not
left waiting for each shard's setup. The driver reads the next shard ahead on a thread of its
own (inference/engine/shards.py) and the shard's later calls are prepared ahead on threads
(inference/engine/shard_worker.py). The shard's program takes its model from the step's own
cache (:func:`inference.engine.shard_worker.hosting`): the model the step loaded is not loaded
again.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass

import pyarrow as pa

from inference.engine.output_partition import ShardReport
from inference.engine.quarantine import QuarantinePlan
from inference.engine.shard_worker import (
    FixedProgram,
    ModelSource,
    ModelStep,
    ShardInput,
    ShardJob,
    ShardResult,
    ShardStopped,
    StartedShard,
    StopCheck,
    hosting,
)
from inference.engine.shard_writer import ShardedWriter
from inference.engine.shards import Watch, row_range_shards, run_partition


@dataclass(eq=False)
class _Handle:
    """A shard handed to the pool: being started on the pool's thread, then finished here."""

    started: Future
    result: ShardResult | None = None
    stopped: ShardStopped | None = None

    @property
    def finished(self) -> bool:
        return self.result is not None or self.stopped is not None


class LocalPool:
    """Computes shards in this process: the model calls of one on the caller's thread while the
    next is started on a thread."""

    # The shard being scored and the one being started. Nothing is read ahead of them: the
    # started shard is already ahead of the model, and a third shard's rows would only be held.
    slots = 2
    read_ahead = 0
    in_process = True

    def __init__(self, stop: StopCheck, models: ModelSource | None = None):
        self._stop, self._models = stop, models
        self._starter = ThreadPoolExecutor(1, thread_name_prefix="nightshift-shard-start")
        self._open: list[_Handle] = []

    def submit(self, job: ShardJob, shard: ShardInput) -> _Handle:
        handle = _Handle(self._starter.submit(self._start, job, shard))
        self._open.append(handle)
        return handle

    def _start(self, job: ShardJob, shard: ShardInput) -> StartedShard:
        with hosting(self._models):
            return StartedShard(job, shard)

    def wait(self, handles: list[_Handle], timeout: float) -> list[_Handle]:
        """Finishes the oldest of ``handles`` on this thread (the driver hands them out in
        order); with no time to wait, only those already finished."""
        ready = [h for h in handles if h.finished]
        if ready or timeout <= 0 or not handles:
            return ready
        self._finish(handles[0])
        return [handles[0]]

    def _finish(self, handle: _Handle) -> None:
        started = handle.started.result()  # a failure to start the shard is raised here
        try:
            with hosting(self._models):
                handle.result = started.finish(self._stop)
        except ShardStopped as stopped:
            handle.stopped = stopped
        finally:
            self._open.remove(handle)

    def result(self, handle: _Handle) -> ShardResult:
        if handle.stopped is not None:
            raise handle.stopped
        return handle.result

    def stop(self, handles: list[_Handle]) -> tuple[list[ShardResult], int]:
        """Nothing is scored once handed back: the finished shards, and the rows the stopped
        lost (a shard only started has lost none)."""
        for handle in handles:
            if not handle.finished:
                self._abandon(handle)
        finished = [h.result for h in handles if h.result is not None]
        return finished, sum(h.stopped.rows_done for h in handles if h.stopped is not None)

    def _abandon(self, handle: _Handle) -> None:
        if handle in self._open:
            self._open.remove(handle)
        if not handle.started.cancel():
            with suppress(Exception):  # the shard's own failure is not the stop's concern
                handle.started.result().close()

    def close(self) -> None:
        """Stops the shards started and not finished, and the pool's thread."""
        for handle in list(self._open):
            self._abandon(handle)
        self._starter.shutdown(wait=True, cancel_futures=True)


def run_local(
    writer: ShardedWriter,
    batches: Iterable[pa.RecordBatch],
    step: ModelStep,
    batch_size: int,
    quarantine: QuarantinePlan | None = None,
    watch: Watch | None = None,
) -> ShardReport:
    """One partition's row ranges scored with ``step`` in this process and committed: the
    engine without Dagster (tests, benchmarks)."""
    watch = watch or Watch()
    job = ShardJob(
        writer.files(),
        FixedProgram(step),
        batch_size,
        quarantine,
        writer.target.uri(writer.target.data_dir()),
    )
    shards = lambda: row_range_shards(batches, writer.shard_rows)  # noqa: E731
    pool = LocalPool(watch.stop)
    try:
        return run_partition(writer, shards, job, pool, watch)
    finally:
        pool.close()
