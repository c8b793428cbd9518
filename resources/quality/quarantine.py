"""Quarantine as Dagster sees it: a run that would quarantine too much fails, what was set
aside is counted in the materialisation's metadata, and each row set aside names its file; and
the data-quality settings of a run: its config, and the one place the deployment's quarantine
limit is read from the environment."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow.parquet as pq
from dagster import Config, Failure, MetadataValue
from pydantic import Field as PydanticField

from inference.engine.output_partition import QUARANTINED_PREFIX, ShardReport
from inference.engine.quarantine import (
    QuarantineLimit,
    QuarantinePlan,
    QuarantineRateExceeded,
    RowConservationError,
)
from resources.storage import DataStore

DEFAULT_SAMPLE_ROWS = 10_000
DEFAULT_SEED = 0
# The share of a partition's rows that may be quarantined before the run fails instead.
DEFAULT_MAX_QUARANTINE_RATE = 0.01
QUARANTINE_RATE_VARIABLE = "NIGHTSHIFT_MAX_QUARANTINE_RATE"
# Rows any day may quarantine whatever its size: a share alone fails a 29-row day on one row.
DEFAULT_QUARANTINE_FLOOR_ROWS = 10
QUARANTINE_FLOOR_VARIABLE = "NIGHTSHIFT_QUARANTINE_FLOOR_ROWS"


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
    plan: QuarantinePlan, store: DataStore, files: Sequence[str]
) -> QuarantinePlan:
    """``plan`` over a landing day's rows, told the day's ``files`` in the order they are read
    (the listing the step scores), so each quarantined row names its ``source_file`` and
    ``source_row_number`` there as well as its ``row_number`` across the day. Row counts come
    from the files' footers."""
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


def quarantine_limit(rate: float | None = None, floor_rows: int | None = None) -> QuarantineLimit:
    """The quarantine limit of a run (see :class:`~inference.engine.quarantine.QuarantineLimit`): a
    day fails when more rows are quarantined than the larger of the share x rows and the floor
    (which never covers more than half a day).

    Each part is the asset's config when set, else the deployment's environment variable
    (``NIGHTSHIFT_MAX_QUARANTINE_RATE``, ``NIGHTSHIFT_QUARANTINE_FLOOR_ROWS``), else 1% and
    10 rows. Read when a run starts, so the landing checks and the scoring step of one
    deployment apply the same limit.
    """
    if rate is None:
        rate = _from_environment(QUARANTINE_RATE_VARIABLE, float, DEFAULT_MAX_QUARANTINE_RATE)
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{QUARANTINE_RATE_VARIABLE}={rate!r} is not a rate in [0, 1]")
    if floor_rows is None:
        floor_rows = _from_environment(
            QUARANTINE_FLOOR_VARIABLE, int, DEFAULT_QUARANTINE_FLOOR_ROWS
        )
        if floor_rows < 0:
            raise ValueError(f"{QUARANTINE_FLOOR_VARIABLE}={floor_rows!r} is negative")
    return QuarantineLimit(rate, floor_rows)


def _from_environment(variable: str, kind: type, default: float) -> float:
    raw = os.environ.get(variable)
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError as exc:
        noun = "a number" if kind is float else "a whole number"
        raise ValueError(f"{variable}={raw!r} is not {noun}") from exc


class QualityConfig(Config):
    """Data-quality settings every asset with quality gates takes in its run config."""

    max_quarantine_rate: float | None = PydanticField(
        default=None,
        ge=0.0,
        le=1.0,
        description="Share of a partition's rows that may be quarantined before the run fails "
        "and publishes nothing (unless within quarantine_floor_rows); default "
        "$NIGHTSHIFT_MAX_QUARANTINE_RATE, else 0.01.",
    )
    quarantine_floor_rows: int | None = PydanticField(
        default=None,
        ge=0,
        description="Rows any partition may quarantine without failing, however small, up to "
        "half its rows: the limit is the larger of this and max_quarantine_rate x rows; "
        "default $NIGHTSHIFT_QUARANTINE_FLOOR_ROWS, else 10.",
    )
    check_sample_rows: int = PydanticField(
        default=DEFAULT_SAMPLE_ROWS,
        ge=0,
        description="Rows of the seeded random sample that row-level expectations run on.",
    )
    check_seed: int = PydanticField(default=DEFAULT_SEED, description="The sample's seed.")
