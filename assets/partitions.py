"""A scored partition as every domain's assets report it: partition keys, the report, its log
line and its checkpoint totals (the runner turns a report into the day's metadata)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from dagster import AssetExecutionContext, Failure

from assets.observability import GpuStats, NodePrice
from inference.engine.metrics import BatchMetrics
from inference.engine.output_partition import ShardReport
from inference.engine.progress import partition_line
from policy.partitions import partition_key_error
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
    """Attempts, interruptions, shards resumed and rows redone over the run's partitions."""
    shards = [r.shards for r in reports if r.shards is not None]
    if not shards:
        return {}
    return {
        "attempt": max(s.attempt for s in shards),
        "interruptions": sum(s.interruptions for s in shards),
        "shards": sum(s.shards for s in shards),
        "shards_resumed": sum(s.shards_resumed for s in shards),
        "rows_redone": sum(s.rows_redone for s in shards),
    }
