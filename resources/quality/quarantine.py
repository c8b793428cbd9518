"""Quarantine as Dagster sees it: a run that would quarantine too much fails, what was set
aside is counted in the materialisation's metadata, and each row set aside names its file."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow.parquet as pq
from dagster import Failure, MetadataValue

from inference.engine.output_partition import QUARANTINED_PREFIX, ShardReport
from inference.engine.quarantine import QuarantinePlan, QuarantineRateExceeded, RowConservationError
from resources.storage import DataStore


@contextmanager
def fail_fast_on_bad_rows() -> Iterator[None]:
    """Too many unscorable rows, or a model that loses rows, fails the step without retries:
    both would be the same on a retry, and nothing has been published."""
    try:
        yield
    except QuarantineRateExceeded as exc:
        raise Failure(
            description=str(exc),
            metadata={
                "quarantine_rate": round(exc.rate, 6),
                "quarantine_limit": exc.limit,
                "quarantine_limit_rows": exc.allowed_rows,
                "quarantine_reasons": MetadataValue.json(exc.reasons),
            },
            allow_retries=False,
        ) from exc
    except RowConservationError as exc:
        raise Failure(description=str(exc), allow_retries=False) from exc


def locate_in_landing(
    plan: QuarantinePlan, store: DataStore, dataset: str, date: str
) -> QuarantinePlan:
    """``plan`` over a landing day's rows, told the day's files in the order they are read, so
    each quarantined row names its ``source_file`` and ``source_row_number`` there as well as
    its ``row_number`` across the day. Row counts come from the files' footers."""
    files = store.landing_files(dataset, date)
    rows = [pq.read_metadata(f, filesystem=store.fs).num_rows for f in files]
    return plan.located([(store.uri(f), n) for f, n in zip(files, rows, strict=True)])


def quarantine_metadata(shards: Sequence[ShardReport]) -> dict[str, Any]:
    """Materialisation metadata: how many rows were quarantined, why, and where they went."""
    reasons: Counter[str] = Counter()
    for report in shards:
        for name, n in report.stats.counts.items():
            if name.startswith(QUARANTINED_PREFIX) and n:
                reasons[name[len(QUARANTINED_PREFIX) :]] += n
    rows_in = sum(s.rows_in for s in shards)
    total = sum(s.rows_quarantined for s in shards)
    meta: dict[str, Any] = {
        "rows_quarantined": total,
        "quarantine_rate": round(total / rows_in, 6) if rows_in else 0.0,
        "quarantine_reasons": MetadataValue.json(dict(reasons.most_common())),
    }
    uris = [s.quarantine_uri for s in shards if s.quarantine_uri]
    if uris:
        meta["quarantine"] = MetadataValue.path(uris[-1])
    return meta
