"""Shards computed in the step's own process (the ``local`` executor).

Each shard is computed when it is handed out, on the step's own thread: the driver reads the
next shard ahead on a thread of its own (inference/engine/shards.py), the shard's calls are prepared
ahead on threads (inference/engine/shard_worker.py), and the model runs where signals are handled, so
an interruption is seen at the next model call. The shard's program takes its model from the
step's own cache (:func:`inference.engine.shard_worker.hosting`): the model the step loaded is not
loaded again.
"""

from __future__ import annotations

from collections.abc import Iterable
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
    StopCheck,
    compute_shard,
    hosting,
)
from inference.engine.shard_writer import ShardedWriter
from inference.engine.shards import Watch, row_range_shards, run_partition


@dataclass(frozen=True, eq=False)
class _Done:
    """A shard computed here: its result, or how far it got before a stop."""

    result: ShardResult | None = None
    stopped: ShardStopped | None = None


class LocalPool:
    """Computes each shard in this process as it is handed out."""

    slots = 1
    in_process = True

    def __init__(self, stop: StopCheck, models: ModelSource | None = None):
        self._stop, self._models = stop, models

    def submit(self, job: ShardJob, shard: ShardInput) -> _Done:
        try:
            with hosting(self._models):
                return _Done(compute_shard(job, shard, self._stop))
        except ShardStopped as stopped:
            return _Done(stopped=stopped)

    def wait(self, handles: list[_Done], timeout: float) -> list[_Done]:
        return list(handles)

    def result(self, handle: _Done) -> ShardResult:
        if handle.stopped is not None:
            raise handle.stopped
        return handle.result

    def stop(self, handles: list[_Done]) -> tuple[list[ShardResult], int]:
        """Nothing runs once handed back: the finished shards, and the rows the stopped lost."""
        finished = [h.result for h in handles if h.result is not None]
        return finished, sum(h.stopped.rows_done for h in handles if h.stopped is not None)

    def close(self) -> None:
        """Nothing to stop: shards run on the caller's thread."""


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
        writer.target.uri(writer.target.final_dir),
    )
    shards = lambda: row_range_shards(batches, writer.shard_rows)  # noqa: E731
    return run_partition(writer, shards, job, LocalPool(watch.stop), watch)
