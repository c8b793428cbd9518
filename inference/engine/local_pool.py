"""Shards computed in the step's own process (the ``local`` executor).

With the progress watchdog on (inference/engine/watchdog.py; the spot-safe step always asks for
it), each shard's model calls run on a thread of their own, one shard at a time, while the
step's thread drives: it records finished shards, sees an interruption at once (a signal is
handled on the step's thread) and asks the watchdog whether the day still moves. A model call
that never returns therefore holds only its own thread: the step stops waiting for it, keeps the
finished shards and fails, whatever the call is stuck in. The stop check is read at every model
call, so an interruption stops the shard being scored at its next call. Without a watchdog
(:func:`run_local`, the engine without Dagster) the model calls run on the caller's thread.

What comes before a shard's first model call (its program: the fraud profile of its accounts;
and its first calls' preparation) runs on a starting thread while the shard before it is
scored, so on a day of many shards the model is not left waiting for each shard's setup. The
driver reads the next shard on the step's thread (inference/engine/shards.py) and the shard's
later calls are prepared ahead on threads (inference/engine/shard_worker.py). The shard's
program takes its model from the step's own cache
(:func:`inference.engine.shard_worker.hosting`): the model the step loaded is not loaded again.

The starting and scoring threads are daemon threads: one stuck in native code, which nothing
can stop, does not keep the process from ending once the step has failed. A call stuck in
native code that holds the interpreter stops the step's thread too: with the watchdog on, the
pool starts a backstop process (inference/engine/backstop.py) that kills the step then, and
tells it each day's kill note.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from contextlib import suppress
from dataclasses import dataclass, field

import pyarrow as pa

from inference.engine.backstop import Backstop, KillNote
from inference.engine.interrupt import WATCHED_SIGNALS
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
from inference.engine.watchdog import (
    Heartbeat,
    ShardAbandoned,
    StallLimit,
    Watchdog,
    raise_in_thread,
)

# How often a stop that waits for the shard being scored asks the watchdog whether it moves.
STOP_POLL_SECONDS = 0.25
ABANDONED = "abandoned: the day stalled"


@dataclass(eq=False)
class _Handle:
    """A shard handed to the pool: started on a starting thread, then scored on its own."""

    started: Future
    result: ShardResult | None = None
    stopped: ShardStopped | None = None
    error: BaseException | None = None
    scoring: threading.Thread | None = None
    abandoned: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def finished(self) -> bool:
        return self.done.is_set()


def _in_thread(name: str, fn: Callable[[], object]) -> Future:
    """``fn`` on a daemon thread of its own, its outcome in the future returned."""
    future: Future = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:  # handed to whoever reads the future
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


class LocalPool:
    """Computes shards in this process: one shard's model calls on a scoring thread (on the
    caller's, without a watchdog) while the next is started on another."""

    # The shard being scored and the one being started. Nothing is read ahead of them: the
    # started shard is already ahead of the model, and a third shard's rows would only be held.
    slots = 2
    read_ahead = 0
    in_process = True

    def __init__(self, stop: StopCheck, models: ModelSource | None = None):
        self._stop, self._models = stop, models
        self._open: list[_Handle] = []
        self._last_start: Future | None = None
        self.heartbeat = Heartbeat()
        self._watchdog: Watchdog | None = None
        self._backstop: Backstop | None = None

    def watchdog(self, limit: StallLimit, note: KillNote | None = None) -> Watchdog:
        """The progress watchdog of the day about to run on this pool (its clock from now),
        with the backstop process behind it (started with the first day watched), which
        writes to ``note`` if it has to kill the step."""
        if not limit.off and self._backstop is None:
            self._backstop = Backstop()
            self.heartbeat.mirror = self._backstop.beat
        if self._backstop is not None and note is not None:
            self._backstop.note(note)
        self._watchdog = Watchdog(self.heartbeat, limit)
        return self._watchdog

    def submit(self, job: ShardJob, shard: ShardInput) -> _Handle:
        before = self._last_start
        started = _in_thread(
            f"nightshift-shard-start-{shard.index}", lambda: self._start(job, shard, before)
        )
        self._last_start = started
        handle = _Handle(started)
        self._open.append(handle)
        return handle

    def _start(self, job: ShardJob, shard: ShardInput, before: Future | None) -> StartedShard:
        if before is not None:  # one shard started at a time, in order
            with suppress(BaseException):  # its own failure is its own shard's to report
                before.exception()
        with hosting(self._models):
            return StartedShard(job, shard)

    def wait(self, handles: list[_Handle], timeout: float) -> list[_Handle]:
        """Scores the oldest of ``handles`` (the driver hands them out in order) on the scoring
        thread; returns those finished, waiting up to ``timeout`` for the oldest."""
        if not handles:
            return []
        oldest = handles[0]
        if not self._watched:
            # Nothing watches the calls: they run here, as the caller waits for them.
            ready = [h for h in handles if h.finished]
            if ready or timeout <= 0:
                return ready
            self._score(oldest)
            return [oldest]
        if oldest.scoring is None and not oldest.finished:
            oldest.scoring = threading.Thread(
                target=self._score, args=(oldest,), name="nightshift-score", daemon=True
            )
            oldest.scoring.start()
        ready = [h for h in handles if h.finished]
        if ready or timeout <= 0:
            return ready
        oldest.done.wait(timeout)
        return [h for h in handles if h.finished]

    @property
    def _watched(self) -> bool:
        return self._watchdog is not None and not self._watchdog.limit.off

    def _score(self, handle: _Handle) -> None:
        if threading.current_thread() is not threading.main_thread():
            # Signals are the step's thread's to handle; blocked here, a signal still waiting
            # for it is seen by this thread's stop check (inference/engine/interrupt.py).
            signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED_SIGNALS)
        try:
            started = handle.started.result()  # a failure to start the shard is raised here
            with hosting(self._models):
                handle.result = started.finish(lambda: self._stop_check(handle), self.heartbeat)
            self.heartbeat.shard_done(handle.result.index, handle.result.metrics.batches)
        except ShardStopped as stopped:
            handle.stopped = stopped
        except ShardAbandoned:
            pass  # the watchdog gave up on this shard; the step has left it
        except BaseException as exc:  # the driver raises it, on the step's thread
            handle.error = exc
        finally:
            handle.done.set()

    def _stop_check(self, handle: _Handle) -> str | None:
        return ABANDONED if handle.abandoned else self._stop()

    def result(self, handle: _Handle) -> ShardResult:
        if handle in self._open:
            self._open.remove(handle)
        if handle.error is not None:
            raise handle.error
        if handle.stopped is not None:
            raise handle.stopped
        return handle.result

    def stop(self, handles: list[_Handle], abandon: bool = False) -> tuple[list[ShardResult], int]:
        """Nothing is scored once handed back: the finished shards, and the rows the stopped
        lost (a shard only started has lost none).

        The shard being scored stops at its next model call; with ``abandon`` (the day
        stalled) it is not waited for, and neither is it once the watchdog finds the wait
        stalled."""
        for handle in handles:
            if handle.scoring is not None and not abandon:
                self._wait_scored(handle)
            if not handle.finished:
                self._abandon(handle)
        finished = [h.result for h in handles if h.result is not None]
        return finished, sum(h.stopped.rows_done for h in handles if h.stopped is not None)

    def _wait_scored(self, handle: _Handle) -> None:
        while not handle.done.wait(STOP_POLL_SECONDS):
            if self._watchdog is not None and self._watchdog.stalled() is not None:
                return

    def _abandon(self, handle: _Handle) -> None:
        if handle in self._open:
            self._open.remove(handle)
        handle.abandoned = True
        if handle.scoring is not None:
            # Python code stops at once; native code when (if ever) it returns.
            raise_in_thread(handle.scoring)
        elif not handle.started.cancel():
            handle.started.add_done_callback(_close_started)

    def close(self) -> None:
        """Stops the shards started and not finished, and the backstop process."""
        for handle in list(self._open):
            self._abandon(handle)
        if self._backstop is not None:
            self.heartbeat.mirror = None
            self._backstop.close()
            self._backstop = None


def _close_started(started: Future) -> None:
    """Stops the preparation threads of a shard started and never scored."""
    if started.exception() is None:
        with suppress(Exception):  # the shard's own failure is not the stop's concern
            started.result().close()


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
