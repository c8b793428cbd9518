"""A partition's progress in its log and on the command line: rows, shards, rate and time to
go, throttled; and its line once scored."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from inference.engine.metrics import BatchMetrics

# At most one progress line per partition this often: a long partition shows how far it got
# without a line per shard in the event log.
PROGRESS_LOG_SECONDS = 10.0
# Off a terminal, the command line's progress at most this often: a CI log stays readable.
PROGRESS_LINE_SECONDS = 60.0


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
        self.log(progress_text(self.what, self.total, rows, resumed, shards, now - self.started))


def progress_text(
    what: str, total: int | None, rows: int, resumed: int, shards: int, elapsed: float
) -> str:
    """``what: rows of total rows (share) in shards, rate, about N s to go``."""
    # Shards an earlier attempt finished were only read past: not this attempt's speed.
    rate = (rows - resumed) / max(elapsed, 1e-9)
    line = f"{what}: {rows:,}"
    if total:
        line += f" of {total:,} rows ({rows / total:.0%})"
    else:
        line += " rows"
    line += f" in {shards} shard{'' if shards == 1 else 's'}, {rate:,.0f} rows/s"
    if total and rate > 0 and rows < total:
        line += f", about {(total - rows) / rate:,.0f} s to go"
    return line


class ProgressLine:
    """The day's progress on the command line (``nightshift run``): one line rewritten in place
    after each shard when ``stream`` is a terminal; elsewhere (a log file, CI) the first update,
    then one line every ``every`` seconds, then the last one."""

    def __init__(
        self,
        stream: TextIO,
        what: str,
        total: int | None,
        every: float = PROGRESS_LINE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stream, self.what, self.total = stream, what, total
        self.every, self.clock = every, clock
        self.live = stream.isatty()
        self.started = clock()
        self.printed: float | None = None  # when the last line was written
        self.pending = ""  # off a terminal: the latest line not written yet

    def __call__(self, rows: int, resumed: int, shards: int) -> None:
        now = self.clock()
        text = progress_text(self.what, self.total, rows, resumed, shards, now - self.started)
        if self.live:
            # Back to the line's start, and clear what a longer line left behind.
            self.stream.write(f"\r{text}\x1b[K")
        elif self.printed is None or now - self.printed >= self.every:
            self.stream.write(text + "\n")
        else:
            self.pending = text
            return
        self.pending, self.printed = "", now
        self.stream.flush()

    def close(self) -> None:
        """Ends the line on a terminal; elsewhere writes the latest update not written yet."""
        if self.live and self.printed is not None:
            self.stream.write("\n")
        elif self.pending:
            self.stream.write(self.pending + "\n")
        self.pending = ""
        self.stream.flush()


def partition_line(asset: str, date: str, metrics: BatchMetrics, uri: str) -> str:
    """The line a scored partition leaves in the log: rows in and out, time, rate, batches and
    where the output went."""
    m = metrics
    return (
        f"{asset} {date}: {m.rows_in} rows in, {m.rows_out} out in {m.seconds:.2f}s "
        f"({m.rows_per_second:,.0f} rows/s, {m.batches} batches) -> {uri}"
    )
