"""Turning a stream of record batches into model-sized batches."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pyarrow as pa

T = TypeVar("T")
_DONE = object()


def rebatch(batches: Iterable[pa.RecordBatch], size: int) -> Iterator[pa.RecordBatch]:
    """Re-cuts a stream of record batches into batches of exactly ``size`` rows (last smaller).

    Only up to ``size`` rows are held at a time, so memory stays flat however large the input.
    """
    if size < 1:
        raise ValueError(f"batch size must be positive, got {size}")
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        offset = 0
        while offset < batch.num_rows:
            take = min(size - held, batch.num_rows - offset)
            pending.append(batch.slice(offset, take))
            held += take
            offset += take
            if held == size:
                yield _concat(pending)
                pending, held = [], 0
    if held:
        yield _concat(pending)


def coalesce(batches: Iterable[pa.RecordBatch], size: int) -> Iterator[pa.RecordBatch]:
    """Joins runs of consecutive small batches into batches of at most ``size`` rows.

    Unlike :func:`rebatch` it never cuts a batch: one that would overflow the pending rows
    goes into the next batch, and one of ``size`` rows or more passes through uncopied. Only up
    to ``size`` rows are held at a time.
    """
    if size < 1:
        raise ValueError(f"batch size must be positive, got {size}")
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        if held and held + batch.num_rows > size:
            yield _concat(pending)
            pending, held = [], 0
        if batch.num_rows >= size:
            yield batch
            continue
        pending.append(batch)
        held += batch.num_rows
    if held:
        yield _concat(pending)


def _concat(parts: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(parts) == 1:
        return parts[0]
    return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]


def length_buckets(
    lengths: Sequence[int] | np.ndarray, max_batch_tokens: int, max_batch_size: int
) -> list[np.ndarray]:
    """Groups item indices into batches of similar length under a padded-token budget.

    Items are sorted by length so each batch pads to a length close to its items' own; a batch
    closes when its padded size (``len(batch) * longest``) would pass ``max_batch_tokens`` or it
    holds ``max_batch_size`` items. An item longer than the budget gets a batch of its own.

    Returns:
        index arrays into ``lengths``, longest batches first (memory problems show up early).
    """
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        longest = max(int(lengths[order[start]]), 1)
        fit = max(1, min(max_batch_size, max_batch_tokens // longest))
        batches.append(order[start : start + fit])
        start += fit
    return batches


def padding_ratio(lengths: Sequence[int] | np.ndarray, batches: list[np.ndarray]) -> float:
    """Fraction of padded token slots that are padding."""
    lengths = np.asarray(lengths)
    padded = sum(len(b) * int(lengths[b].max()) for b in batches if len(b))
    real = int(lengths.sum())
    return 1.0 - real / padded if padded else 0.0


def prefetch(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Produces ``items`` in a background thread, up to ``depth`` ahead of the consumer.

    Reading and decoding the next batches then overlaps the model call on the current one.
    An exception in the producer is re-raised in the consumer.
    """
    return iter(Prefetcher(items, depth))


class Prefetcher:
    """An iterator over ``items`` filled by a background thread; ``depth`` shows how far ahead.

    A queue that is usually full means compute is the bottleneck; usually empty, reading is.
    """

    def __init__(self, items: Iterable[T], depth: int = 2):
        self._items = items
        self._buffer: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def depth(self) -> int:
        return self._buffer.qsize()

    def _produce(self) -> None:
        items = iter(self._items)
        try:
            for item in items:
                while not self._stop.is_set():
                    try:
                        self._buffer.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self._buffer.put(_Failure(exc))
            return
        finally:
            # Items left part-way (the consumer stopped early) are closed on this thread, now:
            # a generator's own cleanup, such as a prefetcher it reads from, runs at once
            # rather than whenever the generator is collected.
            close = getattr(items, "close", None)
            if close is not None:
                close()
        self._buffer.put(_DONE)

    def __iter__(self) -> Iterator[T]:
        self._thread = threading.Thread(
            target=self._produce, name="nightshift-prefetch", daemon=True
        )
        self._thread.start()
        try:
            while True:
                item = self._buffer.get()
                if item is _DONE:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                yield item
        finally:
            self._stop.set()
            while self._thread.is_alive():
                try:
                    self._buffer.get_nowait()
                except queue.Empty:
                    self._thread.join(timeout=0.05)


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Behind:
    """Runs calls in order on one background thread, at most one call behind the caller.

    For a stage that must see batches in order (a builder that grows as it goes) while the
    caller works on the next batch: :meth:`submit` waits for the previous call first, so at
    most one batch is held for it, and re-raises that call's exception. :meth:`wait` before
    reading the stage's result.
    """

    def __init__(self, name: str = "nightshift-behind"):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._pending: Future | None = None

    def submit(self, call: Callable[..., object], *args: object) -> None:
        self.wait()
        self._pending = self._pool.submit(call, *args)

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Stops the thread; a call still running is waited for, its outcome dropped."""
        self._pending = None
        self._pool.shutdown(wait=True, cancel_futures=True)
