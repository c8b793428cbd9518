"""Per-call deadlines: a model call far slower than its shard's others is stopped, tried once
more, then split in halves (as the out-of-memory back-off does) before the shard is failed.

The progress watchdog (inference/engine/watchdog.py) gives up on a whole day that stopped
moving; a deadline acts earlier and on one call: a batch that is many times slower than the
shard's median (the longest texts of the day padded together, a remote call that hangs for a
while) is stopped at :class:`BatchTimeout`'s multiple of that median, and its rows are scored
again, the same rows in the same order, so the shard's output is the one a clean run writes.

The deadline is kept by a monitor thread of the shard's (:class:`CallClock`), not by the call's
own thread: it asks the call's thread to raise :class:`BatchTimedOut`
(:func:`inference.engine.watchdog.raise_in_thread`), which stops Python code at once and native
code only once it returns (a hang in native code is the progress watchdog's to end). The clock
runs where the shard runs, in the step's process or on a Ray worker.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from inference.engine.watchdog import RECENT_BATCHES, forget_raised, raise_in_thread

R = TypeVar("R")

# Calls a shard finishes before its median means anything: its first calls run without a
# deadline (a cold model, a first allocation).
MIN_CALLS = 3


class BatchTimedOut(Exception):
    """Raised in a model call's thread once the call has run past its deadline."""


class BatchTimeoutError(RuntimeError):
    """A single row's model call ran past its deadline twice: the shard is failed."""


@dataclass(frozen=True)
class BatchTimeout:
    """How long one model call may run.

    Args:
        multiple: the deadline is this many times the shard's median model call; 0 (the
            default) turns deadlines off.
        floor: the least deadline, in seconds (short calls jitter).
    """

    multiple: float = 0.0
    floor: float = 1.0

    def __post_init__(self) -> None:
        if self.multiple != 0 and not self.multiple > 1:
            raise ValueError(
                f"batch timeout multiple must be 0 (off) or above 1, got {self.multiple}"
            )
        if not self.floor > 0:
            raise ValueError(f"batch timeout floor must be > 0 seconds, got {self.floor}")

    @property
    def off(self) -> bool:
        return self.multiple == 0

    def deadline(self, seconds: Sequence[float]) -> float | None:
        """The next call's deadline given the shard's call times so far (None: no deadline,
        off or too few calls yet)."""
        if self.off or len(seconds) < MIN_CALLS:
            return None
        return max(self.floor, self.multiple * statistics.median(seconds[-RECENT_BATCHES:]))


class CallClock:
    """A monitor thread that stops the call it was armed for once its deadline passes."""

    def __init__(self) -> None:
        # The call's thread takes the bare lock, whose ``with`` runs no Python code that an
        # error raised into the thread could interrupt with the lock half taken.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._armed: tuple[int, float, threading.Thread] | None = None  # token, due, thread
        self._fired: int | None = None
        self._token = 0
        self._closed = False
        self._monitor: threading.Thread | None = None

    def call(self, fn: Callable[[], R], seconds: float | None) -> R:
        """``fn()`` on this thread, stopped with :class:`BatchTimedOut` after ``seconds``."""
        if seconds is None:
            return fn()
        with self._wake:
            if self._monitor is None:
                self._monitor = threading.Thread(
                    target=self._watch, name="nightshift-batch-clock", daemon=True
                )
                self._monitor.start()
            self._token += 1
            token = self._token
            self._armed = (token, time.monotonic() + seconds, threading.current_thread())
            self._wake.notify()
        try:
            return fn()
        finally:
            # A deadline that passed just as the call returned is raised here (the call is
            # counted as timed out: it did run past its deadline) or dropped here; no error
            # is left pending past this call.
            self._disarm(token)

    def _disarm(self, token: int) -> None:
        with self._lock:
            if self._armed is not None and self._armed[0] == token:
                self._armed = None
            fired, self._fired = self._fired == token, None
        if fired:
            forget_raised()

    def _watch(self) -> None:
        with self._wake:
            while not self._closed:
                if self._armed is None:
                    self._wake.wait()
                    continue
                token, due, thread = self._armed
                left = due - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                self._armed, self._fired = None, token
                raise_in_thread(thread, BatchTimedOut)

    def close(self) -> None:
        """Ends the monitor thread."""
        with self._lock:
            self._closed = True
            self._wake.notify()
