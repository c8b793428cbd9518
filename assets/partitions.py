"""A scored partition as every domain's assets report it: partition keys (and why a key given on
a command line or in a run's tags is not one), the report, its log line and its checkpoint
totals (the runner turns a report into the day's metadata)."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field

import pandas as pd
from dagster import AssetExecutionContext, Failure

from assets.observability import GpuStats, NodePrice
from inference.engine.metrics import BatchMetrics
from inference.engine.output_partition import ShardReport
from inference.engine.progress import partition_line
from policy.partitions import daily_partitions
from resources.storage import Published


@dataclass(frozen=True)
class PartitionReport:
    """What scoring one partition did."""

    date: str
    metrics: BatchMetrics
    published: Published
    shards: ShardReport | None = None
    gpu: GpuStats | None = None
    price: NodePrice | None = None
    capacity: str = "spot"
    # The output's check sample, when it was taken while the rows streamed (else read back).
    sample: pd.DataFrame | None = None
    # Where the shards ran: {"executor": "ray", "workers": 2, ...}; empty on the local engine.
    executor: dict = field(default_factory=dict)
    # Rows landed, in, scored, quarantined and published: the engine's, for the checks.
    conservation: dict = field(default_factory=dict)


def partition_key_error(key: str) -> str | None:
    """Why ``key`` is not one of the daily partitions, in one line; None when it is one.

    Dagster checks a key only where it computes with it (a key before the start date raises a
    `CheckError` inside the step, which the retry policy then retries), so the assets and the
    CLI ask here first and fail on bad input at once.

    Args:
        key: a partition key, as given on a command line or in a run's tags.
    """
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", key):
        return f"partition {key!r} is not a date (YYYY-MM-DD)"
    try:
        day = dt.date.fromisoformat(key)
    except ValueError:
        return f"partition {key!r} is not a date (YYYY-MM-DD)"
    first = daily_partitions.start.date()
    if day < first:
        return f"partition {key} is before the first partition {first} (NIGHTSHIFT_START_DATE)"
    last = daily_partitions.get_last_partition_key()
    if last is None or day > dt.date.fromisoformat(last):
        latest = f"the last partition is {last}" if last else "no partition is over yet"
        return f"partition {key} is not over yet: {latest} (days are UTC)"
    return None


def partition_dates(context: AssetExecutionContext) -> list[str]:
    """The partitions this run covers: one for a normal run, several for a range backfill.

    A key that is not a partition (before the start date, not a date, a day not over yet) is
    bad input: the step fails at once with one line, instead of Dagster's `CheckError` being
    retried by the retry policy.
    """
    keys = context.partition_key_range
    for key in dict.fromkeys([keys.start, keys.end]):
        if (problem := partition_key_error(key)) is not None:
            raise Failure(description=problem, allow_retries=False)
    return list(context.partition_keys)


def log_partition(context: AssetExecutionContext, asset: str, report: PartitionReport) -> None:
    context.log.info(partition_line(asset, report.date, report.metrics, report.published.uri))


def checkpoint_totals(reports: list[PartitionReport]) -> dict[str, int]:
    """Attempts, interruptions (stalls among them), shards resumed and rows redone over the run's partitions."""
    shards = [r.shards for r in reports if r.shards is not None]
    if not shards:
        return {}
    return {
        "attempt": max(s.attempt for s in shards),
        "interruptions": sum(s.interruptions for s in shards),
        "stalls": sum(s.stalls for s in shards),
        "stragglers_copied": sum(s.stragglers_copied for s in shards),
        "straggler_copy_won": sum(s.straggler_copy_won for s in shards),
        "shards": sum(s.shards for s in shards),
        "shards_resumed": sum(s.shards_resumed for s in shards),
        "rows_redone": sum(s.rows_redone for s in shards),
    }
