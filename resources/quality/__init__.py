"""Data-quality gates: Great Expectations 1.x suites run as Dagster asset checks.

``dagster-ge`` pins great-expectations<1, so nightshift calls GE directly: one ephemeral context
per process, a pandas data source, and ``batch.validate(suite)``. Validating every row of a
million-row partition with GE costs more than scoring it, so each suite has two parts:

- ``statistics``: expectations over one row of exact figures that the engine computed while the
  partition streamed through it (counts, nulls, extremes, conservation) — every row counts;
- ``sample``: row-level expectations over a bounded, seeded random sample of the published
  rows, whose size and seed are recorded in the check's metadata.

Suites live beside each domain as reviewable JSON (``assets/<domain>/suites/<asset>.json``), one
file per asset; each named suite in it is one Dagster check with its severity.

Modules: ``suites`` (the JSON files), ``validation`` (running GE) with ``figures`` (statistics
that plainly pass), ``results`` (Dagster check results), ``sampling`` (samples and row counts of
published partitions), ``freshness`` (landing times), ``quarantine`` (failing fast, quarantine
metadata) and ``settings`` (run config and the quarantine limit).
"""

from resources.quality.freshness import landed_hours_after_day_end
from resources.quality.quarantine import (
    fail_fast_on_bad_rows,
    locate_in_landing,
    quarantine_metadata,
)
from resources.quality.results import check_result
from resources.quality.sampling import (
    PositionCursor,
    StreamedSample,
    published_rows,
    sample_output,
    sample_positions,
)
from resources.quality.settings import DEFAULT_SAMPLE_ROWS, QualityConfig, quarantine_limit
from resources.quality.suites import CheckSuite, load_suites
from resources.quality.validation import Evidence, preload_great_expectations, validate

__all__ = [
    "DEFAULT_SAMPLE_ROWS",
    "CheckSuite",
    "Evidence",
    "PositionCursor",
    "QualityConfig",
    "StreamedSample",
    "check_result",
    "fail_fast_on_bad_rows",
    "landed_hours_after_day_end",
    "load_suites",
    "locate_in_landing",
    "preload_great_expectations",
    "published_rows",
    "quarantine_limit",
    "quarantine_metadata",
    "sample_output",
    "sample_positions",
    "validate",
]
