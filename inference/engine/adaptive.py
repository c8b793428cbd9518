"""Batch sizes that back off when the device runs out of memory and grow back when it stops.

A nightly partition does not know in advance which batch will be the largest one (the longest
documents, a wide feature block): a fixed batch size is either too cautious for most batches or
fatal for a few. :class:`AdaptiveBatchSize` halves the size on an out-of-memory error, retries
the same rows at the smaller size, remembers the size that failed, and only tries to grow again
after a run of successes, with each failed attempt to grow doubling the run it waits for next
time. A batch that fails at the smallest size is a real error and is raised, never retried.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

R = TypeVar("R")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether an exception is a device running out of memory (CUDA, MPS or a CPU allocator).

    CUDA raises ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` is the same class);
    MPS and some kernels raise a plain ``RuntimeError`` whose message says "out of memory".
    """
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def release_cached_memory() -> None:
    """Returns the allocator's cached blocks to the device, so a smaller retry can fit."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    mps = getattr(torch, "mps", None)
    if mps is not None and torch.backends.mps.is_available():
        mps.empty_cache()


class BatchTooLargeError(RuntimeError):
    """A batch ran out of memory even at the smallest allowed size.

    Args:
        message: what ran out of memory.
        size: the size of the batch that failed (in the size's units: rows or tokens).
        minimum: the floor the back-off may not go below.
    """

    def __init__(self, message: str, size: int | None = None, minimum: int | None = None):
        super().__init__(message)
        self.size, self.minimum = size, minimum

    def __reduce__(self) -> tuple:  # crosses from a Ray worker to the driver intact
        return BatchTooLargeError, (str(self), self.size, self.minimum)


@dataclass
class AdaptiveBatchSize:
    """The current batch size, with out-of-memory back-off and growth after successes.

    Args:
        size: the size to start with (usually the configured ``max_batch_size``).
        minimum: never shrink below this; an out-of-memory error at it is raised.
        maximum: never grow above this (default: the starting size).
        patience: successful batches in a row before trying a size twice as large.
    """

    size: int
    minimum: int = 1
    maximum: int | None = None
    patience: int = 8
    ooms: int = 0
    grows: int = 0
    failed_at: int | None = None  # the smallest size that ran out of memory, if any did
    history: list[tuple[str, int]] = field(default_factory=list)
    _streak: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.minimum < 1 or self.size < self.minimum:
            raise ValueError(
                f"need 1 <= minimum <= size, got minimum={self.minimum}, size={self.size}"
            )
        if self.maximum is None:
            self.maximum = self.size
        if self.maximum < self.size:
            raise ValueError(f"maximum {self.maximum} is below the starting size {self.size}")
        if self.patience < 1:
            raise ValueError(f"patience must be positive, got {self.patience}")

    def record_success(self) -> None:
        """Counts a batch that fitted; after ``patience`` in a row, doubles the size (capped)."""
        self._streak += 1
        if self._streak >= self.patience and self.size < self.maximum:
            self.size = min(self.maximum, self.size * 2)
            self.grows += 1
            self._streak = 0
            self.history.append(("grow", self.size))

    def record_out_of_memory(self, size: int) -> None:
        """Halves the size after a batch of ``size`` items ran out of memory.

        Raises:
            BatchTooLargeError: ``size`` was already the minimum, so a retry cannot help.
        """
        self.ooms += 1
        self._streak = 0
        if size <= self.minimum:
            raise BatchTooLargeError(
                f"out of memory on a batch of {size} at the minimum batch size {self.minimum}: "
                "the model or a single item does not fit this device",
                size,
                self.minimum,
            )
        if self.failed_at is not None and size >= self.failed_at:
            # Growing back into a size that failed before failed again: wait twice as long
            # before the next attempt, so a tight device sees rarer and rarer probes.
            self.patience *= 2
        self.failed_at = size if self.failed_at is None else min(self.failed_at, size)
        self.size = max(self.minimum, min(self.size, size) // 2)
        self.history.append(("oom", size))
        release_cached_memory()

    def run(
        self, total: int, call: Callable[[int, int], R], unit: int = 1
    ) -> Iterator[tuple[int, int, R]]:
        """Processes items ``0..total`` in consecutive batches at the adaptive size.

        ``call(start, stop)`` runs one batch. A batch that runs out of memory is retried from
        the same ``start`` at half the size, so every item is processed exactly once and in
        order; each halving is one retry, so one batch is tried at most log2(size) times.

        Args:
            total: items to process.
            call: runs items ``start .. stop``.
            unit: what one item costs in the size's units (the size is a token budget and an
                item is ``unit`` tokens long): a batch holds ``size // unit`` items, at least
                one. An item that alone runs out of memory raises :class:`BatchTooLargeError`.

        Yields:
            ``(start, stop, result)`` for each batch that succeeded.
        """
        start = 0
        while start < total:
            stop = min(total, start + max(1, self.size // unit))
            failed = False
            try:
                result = call(start, stop)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                failed = True
            if failed:
                # Handled outside the except block, once the exception (and the failed batch's
                # tensors its traceback holds) is gone, so the cache release can free them.
                if stop - start == 1 and unit > 1:
                    self.ooms += 1
                    raise BatchTooLargeError(
                        f"out of memory on a single item of {unit} (batch budget {self.size}): "
                        "one item does not fit this device",
                        unit,
                        self.minimum,
                    )
                self.record_out_of_memory((stop - start) * unit)
                continue
            self.record_success()
            yield start, stop, result
            start = stop

    def describe(self, name: str = "model_batch_size") -> dict[str, int]:
        """What the back-off did, for a run's metadata: the size now under ``name``, how many
        out-of-memory errors it backed off from, and how often it grew back."""
        return {name: self.size, "oom_backoffs": self.ooms, f"{name}_grows": self.grows}


class BatchSizes:
    """The adaptive sizes of one model (or device), one per configured limit and kind.

    Kept on whatever lives as long as the model (the scorer, the encoder, the recommender), so
    a size that had to shrink carries over to the next call and the next partition instead of
    running out of memory again.
    """

    def __init__(self) -> None:
        self._sizes: dict[tuple[str, int], AdaptiveBatchSize] = {}

    def at(self, limit: int, kind: str = "") -> AdaptiveBatchSize:
        """The size that starts at (and never exceeds) ``limit``, for batches of ``kind``."""
        if (kind, limit) not in self._sizes:
            self._sizes[kind, limit] = AdaptiveBatchSize(limit)
        return self._sizes[kind, limit]

    @property
    def ooms(self) -> int:
        """Out-of-memory errors backed off from, over every size."""
        return sum(size.ooms for size in self._sizes.values())
