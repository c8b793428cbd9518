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

Modules: ``suites`` (the JSON files, a suite's evidence and its Dagster check result),
``validation`` (running GE and the suites over a run's partitions, the statistics that
plainly pass without GE, and a day's row-conservation figures), ``sampling`` (samples and row
counts of published partitions), and ``quarantine`` (failing fast, quarantine metadata, the run config and the
quarantine limit).
"""

from resources.quality.quarantine import (
    DEFAULT_SAMPLE_ROWS,
    QualityConfig,
    fail_fast_on_bad_rows,
    locate_in_landing,
    quarantine_limit,
    quarantine_metadata,
)
from resources.quality.sampling import (
    PositionCursor,
    StreamedSample,
    published_rows,
    sample_output,
    sample_positions,
)
from resources.quality.suites import CheckSuite, Evidence, check_result, load_suites
from resources.quality.validation import (
    SuiteRun,
    conservation_figures,
    preload_great_expectations,
    validate,
)

__all__ = [
    "DEFAULT_SAMPLE_ROWS",
    "CheckSuite",
    "Evidence",
    "PositionCursor",
    "QualityConfig",
    "StreamedSample",
    "SuiteRun",
    "check_result",
    "conservation_figures",
    "fail_fast_on_bad_rows",
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
