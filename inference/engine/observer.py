"""What the shard loop tells a watcher of the day while it runs: the live figures after each
shard it records.

No metrics library here: the engine hands a :class:`ShardSeen` to whatever the step gave it
(a :class:`DayObserver`), and the layer above decides where the figures go (Prometheus, in
``resources/run_metrics.py``). Days scored with no observer pay nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from inference.engine.metrics import BatchMetrics


@dataclass(frozen=True)
class ShardSeen:
    """The day as the loop sees it after recording a shard.

    Args:
        rows_read: input rows in the finished shards, this attempt's and those an earlier
            attempt finished (each row counted once).
        rows_resumed: of them, the rows of shards an earlier attempt finished.
        shards_done: shards finished so far, by this attempt or earlier ones.
        shards_in_flight: shards handed to the pool and not yet recorded.
        rows_redone: rows this attempt computed again after an interruption.
        interruptions: the day's interruptions so far, over all its attempts.
        metrics: this attempt's batch figures so far (the loop keeps adding to them).
    """

    rows_read: int
    rows_resumed: int
    shards_done: int
    shards_in_flight: int
    rows_redone: int
    interruptions: int
    metrics: BatchMetrics


class DayObserver(Protocol):
    """Told after each shard the loop records; it must return quickly and never raise for
    a reason of its own (a monitoring outage must not fail the day)."""

    def shard_done(self, seen: ShardSeen) -> None: ...
