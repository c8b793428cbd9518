"""Throughput and batch statistics the engine records while it runs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class BatchMetrics:
    """Counts rows and batches and times the model calls of one partition's run."""

    rows_in: int = 0
    rows_out: int = 0
    batches: int = 0
    compute_seconds: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None

    def record_batch(self, rows_in: int, rows_out: int, seconds: float) -> None:
        self.rows_in += rows_in
        self.rows_out += rows_out
        self.batches += 1
        self.compute_seconds += seconds
        self.batch_sizes.append(rows_in)

    def finish(self) -> BatchMetrics:
        self.finished = time.perf_counter()
        return self

    @property
    def seconds(self) -> float:
        return (self.finished or time.perf_counter()) - self.started

    @property
    def rows_per_second(self) -> float:
        return self.rows_in / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_batch_size(self) -> float:
        return self.rows_in / self.batches if self.batches else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "rows_in": self.rows_in,
            "rows_out": self.rows_out,
            "seconds": round(self.seconds, 4),
            "rows_per_second": round(self.rows_per_second, 1),
            "batch_count": self.batches,
            "mean_batch_size": round(self.mean_batch_size, 1),
            "compute_seconds": round(self.compute_seconds, 4),
        }
