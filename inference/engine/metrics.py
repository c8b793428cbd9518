"""Throughput, latency and time-split statistics the engine records while it runs."""

from __future__ import annotations

import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

PHASES = ("read", "preprocess", "compute", "write")
# Upper bounds of the time-to-first-token buckets, in seconds: a request's first token comes
# after its call's prefill (milliseconds) or after the batches queued ahead of it in the same
# call (minutes), so the range is wide, as vLLM's is. A day's times are kept as counts per
# bucket, not as a list: shards and workers merge them exactly, in bounded memory.
FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip


@dataclass(frozen=True)
class NodePrice:
    """What one inference node costs per hour, in USD, on spot and on on-demand capacity."""

    spot_per_hour: float
    on_demand_per_hour: float


@dataclass
class BatchMetrics:
    """Counts rows and batches, and times each model call and each phase of one partition's run.

    The engine calls ``record_batch`` once per model call and ``add_phase`` for the time spent
    reading, preprocessing, computing and writing; text models add ``tokens``, generation
    models each request's time to its first token (``record_first_tokens``).
    """

    rows_in: int = 0
    rows_out: int = 0
    batches: int = 0
    tokens: int = 0
    compute_seconds: float = 0.0
    batch_timeouts: int = 0  # model calls stopped at their deadline (batch_timeout.py)
    batch_splits: int = 0  # calls split in halves after timing out twice
    batch_sizes: list[int] = field(default_factory=list)
    batch_seconds: list[float] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    queue_depths: list[int] = field(default_factory=list)
    # Requests per FIRST_TOKEN_BUCKETS bucket (a value counts in the first bound it does not
    # exceed; the last count is past every bound), their sum and their largest value.
    first_token_counts: list[int] = field(
        default_factory=lambda: [0] * (len(FIRST_TOKEN_BUCKETS) + 1)
    )
    first_token_sum: float = 0.0
    first_token_max: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None

    def record_batch(self, rows_in: int, rows_out: int, seconds: float) -> None:
        self.rows_in += rows_in
        self.rows_out += rows_out
        self.batches += 1
        self.compute_seconds += seconds
        self.batch_sizes.append(rows_in)
        self.batch_seconds.append(seconds)

    def add_phase(self, phase: str, seconds: float) -> None:
        if phase not in self.phase_seconds:
            raise ValueError(f"unknown phase '{phase}': expected one of {', '.join(PHASES)}")
        self.phase_seconds[phase] += seconds

    def observe_queue_depth(self, depth: int) -> None:
        self.queue_depths.append(depth)

    def record_first_tokens(self, seconds: Sequence[float]) -> None:
        """Each request's seconds from the start of its model call to its first new token."""
        if not len(seconds):
            return
        values = np.asarray(seconds, dtype=np.float64)
        where = np.searchsorted(FIRST_TOKEN_BUCKETS, values, side="left")
        added = np.bincount(where, minlength=len(self.first_token_counts))
        counts = zip(self.first_token_counts, added.tolist(), strict=True)
        self.first_token_counts = [a + b for a, b in counts]
        self.first_token_sum += float(values.sum())
        self.first_token_max = max(self.first_token_max, float(values.max()))

    @property
    def first_tokens(self) -> int:
        """Requests whose first-token time was recorded."""
        return sum(self.first_token_counts)

    def merge(self, other: BatchMetrics) -> None:
        """Adds another run's counts (e.g. the next partition of a range) to this one."""
        self.rows_in += other.rows_in
        self.rows_out += other.rows_out
        self.batches += other.batches
        self.tokens += other.tokens
        self.compute_seconds += other.compute_seconds
        self.batch_timeouts += other.batch_timeouts
        self.batch_splits += other.batch_splits
        self.batch_sizes += other.batch_sizes
        self.batch_seconds += other.batch_seconds
        self.queue_depths += other.queue_depths
        self.first_token_counts = [
            a + b for a, b in zip(self.first_token_counts, other.first_token_counts, strict=True)
        ]
        self.first_token_sum += other.first_token_sum
        self.first_token_max = max(self.first_token_max, other.first_token_max)
        for phase, seconds in other.phase_seconds.items():
            self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + seconds

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
        return sum(self.batch_sizes) / self.batches if self.batches else 0.0

    def latency_percentiles(self) -> dict[str, float]:
        """Model-call latency p50/p95/p99 in milliseconds (empty when no batch ran)."""
        if not self.batch_seconds:
            return {}
        values = np.percentile(np.asarray(self.batch_seconds) * 1000, [50, 95, 99])
        return {
            f"batch_latency_p{p}_ms": round(float(v), 3)
            for p, v in zip((50, 95, 99), values, strict=True)
        }

    def first_token_percentiles(self) -> dict[str, float]:
        """Time to first token p50/p95 in seconds (empty when no request had one), from the
        buckets as Prometheus's ``histogram_quantile`` estimates them (linear within a
        bucket), never above the largest time recorded."""
        total = self.first_tokens
        if not total:
            return {}
        cumulative = np.cumsum(self.first_token_counts)
        lows = (0.0, *FIRST_TOKEN_BUCKETS)
        out = {}
        for p in (50, 95):
            rank = total * p / 100
            i = int(np.searchsorted(cumulative, rank, side="left"))
            if i == len(FIRST_TOKEN_BUCKETS):
                value = self.first_token_max  # past the last bound: nothing to interpolate
            else:
                below = cumulative[i - 1] if i else 0
                share = (rank - below) / self.first_token_counts[i]
                value = lows[i] + (FIRST_TOKEN_BUCKETS[i] - lows[i]) * share
            out[f"ttft_p{p}_s"] = round(min(float(value), self.first_token_max), 6)
        return out

    def as_dict(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {
            "rows_in": self.rows_in,
            "rows_out": self.rows_out,
            "seconds": round(self.seconds, 4),
            "rows_per_second": round(self.rows_per_second, 1),
            "rows_computed": sum(self.batch_sizes),
            "batch_count": self.batches,
            "mean_batch_size": round(self.mean_batch_size, 1),
            "compute_seconds": round(self.compute_seconds, 4),
            "batch_timeouts": self.batch_timeouts,
            "batch_splits": self.batch_splits,
        }
        if self.tokens:
            out["tokens"] = self.tokens
            out["tokens_per_second"] = round(self.tokens / self.seconds, 1) if self.seconds else 0.0
        return out


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB.

    Read from ``VmHWM`` where Linux has it: ``ru_maxrss`` of a child process starts at its
    parent's peak (the high-water mark survives the exec), which would hide the child's own.
    """
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
