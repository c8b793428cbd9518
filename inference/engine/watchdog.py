"""A day that stops moving: the progress watchdog of every scoring step.

A night that hangs is worse than one that fails: no retry fires and the morning passes. The
shards' model calls beat a :class:`Heartbeat` as each batch finishes; the driver, which never
runs a model call itself, asks the :class:`Watchdog` between its waits on the pool. When no
batch has finished for the day's stall limit (:class:`StallLimit`: a multiple of the day's own
median batch time between a floor and a ceiling, or a fixed override), the driver stops the
stuck work, keeps every finished shard and fails the step as an interruption, so the run's
retry resumes from the checkpoint.

The driver does not depend on the stuck thread: in the step's process the model calls run on a
thread of their own (inference/engine/local_pool.py), so a call that never returns, in Python
or in native code that lets go of the interpreter, leaves the driver free to fail the step.
Python code that is stuck is also asked to stop (:func:`raise_in_thread`); native code cannot
be, and its thread is left behind, as the process is about to end. Native code that never lets
go of the interpreter stops the driver too: a process beside the step, which needs nothing of
it, kills the step once the limit and a grace have passed (inference/engine/backstop.py).
"""

from __future__ import annotations

import ctypes
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

# The least grace the backstop process (inference/engine/backstop.py) gives the step's own
# watchdog past the limit: the step's watchdog is asked every fraction of a second while the
# interpreter runs, but a loaded node, a long garbage collection or a slow write of the
# failure can delay it, and a kill that beats it would lose the failure's message and retry
# tags. A grace of at least this and at least the limit itself keeps the step's own Stalled
# first whenever the interpreter is free; only a call that holds it is left to the backstop.
BACKSTOP_GRACE_FLOOR = 30.0

# The model-call times the median is taken over: the latest ones, so a day whose batches
# slow down as it goes (longer texts at the end) is judged by its recent pace.
RECENT_BATCHES = 1024


class Mirror(Protocol):
    """A copy of the heartbeat outside the step's interpreter (the backstop's shared file,
    inference/engine/backstop.py ``SharedBeat``)."""

    def moved(self, when: float, shard: int | None, batches: int) -> None: ...

    def limit(self, limit: float, grace: float) -> None: ...


@dataclass(frozen=True)
class StallLimit:
    """How long a day may go without a model call finishing before it counts as stalled.

    Args:
        seconds: a fixed limit that overrides the rest; 0 turns the watchdog off.
        floor: the least limit derived from batch times (short batches jitter).
        ceiling: the most; also the limit before the day's first batch has finished, when
            its batch time is not known yet (a first shard's setup, a cold model).
        batch_multiple: the limit is this many times the day's median model call.
        backstop_grace: how long past the limit the backstop process waits before it kills a
            step whose interpreter a native call holds; None: the limit itself, at least
            :data:`BACKSTOP_GRACE_FLOOR`.
    """

    seconds: float | None = None
    floor: float = 60.0
    ceiling: float = 900.0
    batch_multiple: float = 20.0
    backstop_grace: float | None = None

    def __post_init__(self) -> None:
        if self.seconds is not None and self.seconds < 0:
            raise ValueError(f"stall seconds must be >= 0 (0 turns it off), got {self.seconds}")
        if not 0 < self.floor <= self.ceiling:
            raise ValueError(
                f"stall floor ({self.floor} s) must be > 0 and at most the ceiling "
                f"({self.ceiling} s)"
            )
        if not self.batch_multiple > 0:
            raise ValueError(f"stall batch multiple must be > 0, got {self.batch_multiple}")
        if self.backstop_grace is not None and not self.backstop_grace > 0:
            raise ValueError(f"stall backstop grace must be > 0 s, got {self.backstop_grace}")

    @property
    def off(self) -> bool:
        return self.seconds == 0

    def after(self, median_batch: float | None) -> float:
        """The limit, given the day's median model call (None before the first one)."""
        if self.seconds:
            return self.seconds
        if median_batch is None:
            return self.ceiling
        return min(max(self.floor, self.batch_multiple * median_batch), self.ceiling)

    def grace(self, limit: float) -> float:
        """The backstop's grace past ``limit`` (see :data:`BACKSTOP_GRACE_FLOOR`)."""
        if self.backstop_grace is not None:
            return self.backstop_grace
        return max(BACKSTOP_GRACE_FLOOR, limit)

    def why(self, median_batch: float | None) -> str:
        """Where the limit came from, in words, for the failure's message."""
        if self.seconds:
            return "the configured stall seconds"
        if median_batch is None:
            return "the ceiling: no batch had finished yet"
        derived = self.batch_multiple * median_batch
        said = f"{self.batch_multiple:g}x the day's median batch of {median_batch:.3g} s"
        if derived < self.floor:
            return f"the floor; {said}"
        if derived > self.ceiling:
            return f"the ceiling; {said}"
        return said


class Heartbeat:
    """When a model call last finished, and where each shard in flight got to.

    Written by the threads that run model calls (or by the driver, from the Ray workers'
    beats), read by the driver's watchdog: each write is one assignment the interpreter makes
    whole, and the shards in flight are copied before they are read. Where a backstop process
    watches the step (inference/engine/backstop.py), each move is also written to its
    ``mirror``.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.mirror: Mirror | None = None
        self._last = (clock(), None, 0)
        self._seconds: deque[float] = deque(maxlen=RECENT_BATCHES)
        self._open: dict[int, tuple[float, int]] = {}  # shard -> (its latest beat, batches)
        self._done: set[int] = set()
        self._waiting: set[int] = set()  # shards handed out again, not begun yet

    def restart(self) -> None:
        """A new day: its own batch times, and its clock from now."""
        self._seconds.clear()
        self._open, self._done, self._waiting = {}, set(), set()
        self._last = (self.clock(), None, 0)

    def handed_out(self) -> None:
        """The driver handed a shard to the pool: the day moves (after a long first read of
        the input, its clock starts here). A pool takes a new shard only once one is done, so
        this never hides a stuck call."""
        self._last = (self.clock(), *self._last[1:])

    def shard_started(self, shard: int) -> None:
        """A shard's model calls begin: the wait is counted from here, not from the shard
        before (its files were written in between)."""
        now = self.clock()
        self._waiting.discard(shard)
        if shard not in self._done:  # a Ray worker's start, read after the shard's result
            self._open[shard] = (now, 0)
        self._last = (now, shard, 0)

    def cold(self, shards: set[int]) -> None:
        """The stuck work's ``shards`` were handed out again (to a fresh worker, maybe): the
        day's clock starts again here, and until each has begun the limit is the ceiling (a
        fresh worker's start, a model load, is not a stall)."""
        self._waiting = set(shards)
        self._last = (self.clock(), *self._last[1:])

    def beat(self, shard: int, batches: int, seconds: float | None) -> None:
        """A model call of ``shard`` finished, its ``batches``-th, after ``seconds`` (None: a
        call whose rows were all quarantined, which ran no model)."""
        if seconds is not None:
            self._seconds.append(seconds)
        self._waiting.discard(shard)
        now = self.clock()
        if shard not in self._done:
            self._open[shard] = (now, batches)
        self._last = (now, shard, batches)

    def shard_done(self, shard: int, batches: int) -> None:
        """A shard's calls are all done: progress, and no longer a shard that may be stuck."""
        self._done.add(shard)
        self._open.pop(shard, None)
        self._waiting.discard(shard)
        self._last = (self.clock(), shard, batches)

    def median(self) -> float | None:
        """The day's median model call (its recent ones), None before the first, and while
        shards handed out again have not begun (see :meth:`cold`)."""
        if self._waiting or not self._seconds:
            return None
        return statistics.median(list(self._seconds))

    @property
    def _last(self) -> tuple[float, int | None, int]:
        """When the day last moved, the shard that moved it and that shard's batches done."""
        return self._moved

    @_last.setter
    def _last(self, moved: tuple[float, int | None, int]) -> None:
        self._moved = moved
        if self.mirror is not None:
            self.mirror.moved(*moved)

    @property
    def last(self) -> float:
        """When the day last moved (clock seconds)."""
        return self._last[0]

    def stuck(self) -> tuple[int | None, int]:
        """The shard that has gone longest without a model call finishing, among those in
        flight, and its batches finished; else the shard that moved last."""
        shards = list(self._open.items())
        if not shards:
            return self._last[1], self._last[2]
        shard, (_, batches) = min(shards, key=lambda item: item[1][0])
        return shard, batches


@dataclass(frozen=True)
class Stall:
    """A day that stopped moving: where, and how long it waited."""

    shard: int | None
    batches: int  # model calls the stuck shard had finished
    waited: float
    limit: float
    why: str

    def describe(self) -> str:
        """One line: the shard, its last batch, the wait and the limit."""
        if self.shard is None:
            where = "before any shard's model calls began"
        elif self.batches:
            where = f"in shard {self.shard} after its batch {self.batches}"
        else:
            where = f"in shard {self.shard} before its first batch finished"
        return (
            f"no model call finished for {self.waited:.1f} s {where} "
            f"(limit {self.limit:.1f} s: {self.why})"
        )


class Watchdog:
    """Judges the heartbeat against the stall limit; the driver asks between its waits."""

    def __init__(self, heartbeat: Heartbeat, limit: StallLimit):
        self.heartbeat, self.limit = heartbeat, limit
        heartbeat.restart()
        if heartbeat.mirror is not None:  # the ceiling until a batch is timed; 0: disarmed
            first = 0.0 if limit.off else limit.after(None)
            heartbeat.mirror.limit(first, limit.grace(first) if first else 0.0)

    def stand_down(self) -> None:
        """The day's model calls are over (committed, or left for a retry): the backstop
        stands down until the next day's watchdog, so what the step does between days (a
        commit, the next day's first read) is never taken for a stuck model call."""
        if self.heartbeat.mirror is not None:
            self.heartbeat.mirror.limit(0.0, 0.0)

    def stalled(self) -> Stall | None:
        """The stall, once no model call has finished within the limit; else None."""
        if self.limit.off:
            return None
        waited = self.heartbeat.clock() - self.heartbeat.last
        median = self.heartbeat.median()
        limit = self.limit.after(median)
        if self.heartbeat.mirror is not None:
            self.heartbeat.mirror.limit(limit, self.limit.grace(limit))
        if waited < limit:
            return None
        shard, batches = self.heartbeat.stuck()
        return Stall(shard, batches, waited, limit, self.limit.why(median))


class ShardAbandoned(Exception):
    """Raised in a model call's thread that the watchdog gave up on, to stop its Python code."""


def raise_in_thread(thread: threading.Thread, error: type[BaseException] = ShardAbandoned) -> bool:
    """Asks ``thread`` to raise ``error`` (:class:`ShardAbandoned` unless told) at its next
    Python instruction.

    CPython's ``PyThreadState_SetAsyncExc`` is the only way to stop another thread's Python
    code; it has no public wrapper, so it is called here, in one place. It cannot reach a
    thread inside native code until that code returns. Returns whether the thread was found.
    """
    if thread.ident is None or not thread.is_alive():
        return False
    found = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(error)
    )
    return found == 1


class _Forgotten(Exception):
    """Raised into this thread by :func:`forget_raised` and caught there at once."""


def forget_raised() -> None:
    """Drops an error :func:`raise_in_thread` asked this thread to raise and it has not raised
    yet (one asked for just as the work it was meant to stop finished).

    CPython 3.11 has no safe way to withdraw the request: ``PyThreadState_SetAsyncExc`` with no
    error leaves the interpreter's "an error is pending" flag set with nothing to clear it, and
    from then on any profiled or traced thread spins for ever on its next function call. So the
    pending error is replaced by one of this module's own and raised and caught here, which
    clears the flag the way any raised error does.
    """
    try:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(threading.get_ident()), ctypes.py_object(_Forgotten)
        )
        for _ in range(1_000_000):  # raised at the loop's first jump back
            pass
    except _Forgotten:
        return
