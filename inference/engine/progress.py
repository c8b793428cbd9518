"""A partition's progress in its log: rows, shards, rate and time to go, throttled; and its
line once scored."""

from __future__ import annotations

import time
from collections.abc import Callable

from inference.engine.metrics import BatchMetrics

# At most one progress line per partition this often: a long partition shows how far it got
# without a line per shard in the event log.
PROGRESS_LOG_SECONDS = 10.0


class ProgressLog:
    """Logs how far a partition got, throttled to one line every ``every`` seconds.

    ``fraud_scores 2026-03-01: 2,500,000 of 10,000,000 rows (25%) in 10 shards, 1,020,000
    rows/s, about 7 s to go``; without a known total, the rows and rate alone.
    """

    def __init__(
        self,
        log: Callable[[str], None],
        what: str,
        total: int | None,
        every: float = PROGRESS_LOG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.log, self.what, self.total, self.every, self.clock = log, what, total, every, clock
        self.started = self.last = clock()

    def __call__(self, rows: int, resumed: int, shards: int) -> None:
        now = self.clock()
        if now - self.last < self.every:
            return
        self.last = now
        # Shards an earlier attempt finished were only read past: not this attempt's speed.
        rate = (rows - resumed) / max(now - self.started, 1e-9)
        line = f"{self.what}: {rows:,}"
        if self.total:
            line += f" of {self.total:,} rows ({rows / self.total:.0%})"
        else:
            line += " rows"
        line += f" in {shards} shard{'' if shards == 1 else 's'}, {rate:,.0f} rows/s"
        if self.total and rate > 0 and rows < self.total:
            line += f", about {(self.total - rows) / rate:,.0f} s to go"
        self.log(line)


def partition_line(asset: str, date: str, metrics: BatchMetrics, uri: str) -> str:
    """The line a scored partition leaves in the log: rows in and out, time, rate, batches and
    where the output went."""
    m = metrics
    return (
        f"{asset} {date}: {m.rows_in} rows in, {m.rows_out} out in {m.seconds:.2f}s "
        f"({m.rows_per_second:,.0f} rows/s, {m.batches} batches) -> {uri}"
    )
