"""The one landing runner: every source dataset is a spec and a few lines.

A landing asset checks each day of the run on its own: the files carry the contract's columns
and types (a missing day or a malformed file fails here, naming the dataset, date, file and
column), every row is screened against the contract (what scoring will quarantine, and why),
and the dataset's suites judge the screening; each day is then recorded with its own rows,
quarantine figures and check results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from dagster import AssetCheckResult, AssetExecutionContext, MetadataValue
from pydantic import Field

from assets.days import DayRecorder
from assets.errors import fail_fast_on_bad_input
from assets.gates import LandingGate, Screen
from assets.landing_reads import LANDING_FINGERPRINT, landing_day, record_landing_read
from assets.partitions import partition_dates
from resources.quality import QualityConfig, preload_great_expectations, quarantine_limit
from resources.storage import DataStore, StorageResource

# Every landing dataset's spec by name, filled as the domains declare them (at import), so that
# a scoring asset can land its input's day in its own step (``assets/upstream.py``).
LANDINGS: dict[str, LandingSpec] = {}

# What a landing day's metadata says about the check it had: the files' fingerprint, and
# whether its blocking checks passed.
CHECKED, PASSED = "landing_checks", "passed"

# What a day's screening publishes beside it: metadata for the dataset's own materialisation
# and for each companion asset recorded with it (e.g. the saved screen).
Publish = Callable[[DataStore, str, Any, Any, float], Mapping[str, Mapping[str, Any]]]


@dataclass(frozen=True)
class LandingSpec:
    """A landing dataset: its contract, how a day is screened, what the screening publishes.

    Args:
        dataset: the landing dataset (``landing/<dataset>/date=D/``).
        schema: its contract's columns and types.
        gate: its suites, and which quarantine reasons each check counts.
        screen: ``(store, date, config, max_quarantine_rate) -> Screen``.
        publish: ``(store, date, screen, config, max_quarantine_rate) -> {asset: metadata}``.
        config: the landing asset's config class; with it a scoring step can land a day that
            was never checked (see ``assets/upstream.py``).
    """

    dataset: str
    schema: pa.Schema
    gate: LandingGate
    screen: Callable[[DataStore, str, Any, float], Screen]
    publish: Publish | None = None
    config: type[QualityConfig] | None = None

    def __post_init__(self) -> None:
        LANDINGS[self.dataset] = self

    @property
    def blocking(self) -> set[str]:
        """The names of its blocking checks."""
        return {name for name, suite in self.gate.suites.items() if suite.blocking}


def deadline(hours: float, schedule: str) -> Any:
    """The ``deadline_hours`` setting of a landing dataset's config: hours after its UTC day
    ends by which a day's files should have landed (``schedule`` says why that many)."""
    return Field(
        default=hours,
        description="Hours after its UTC day ends by which a day's files should have landed "
        f"({schedule}).",
    )


def land_files(
    context: AssetExecutionContext, storage: StorageResource, dataset: str, schema: pa.Schema
) -> Iterator[Any]:
    """A landing dataset checked against its contract's columns and types only (no screening,
    no suites), each day recorded on its own with its rows."""
    store, days = storage.store(), DayRecorder(context)
    dates = partition_dates(context)
    record_landing_read(context, store, dataset, dates)
    for date in dates:
        fingerprint = store.landing_fingerprint(dataset, date) or ""
        landed = landing_day(context, store, dataset, schema, date)
        # Its contract is its whole check: a scoring step reads this day as checked.
        metadata = {**landed, LANDING_FINGERPRINT: fingerprint, CHECKED: PASSED}
        yield from days.record(dataset, date, metadata)
    yield from days.finish()


def land(
    context: AssetExecutionContext,
    spec: LandingSpec,
    config: QualityConfig,
    storage: StorageResource,
) -> Iterator[Any]:
    """Checks and screens every day of the run, recording each as soon as it is done.

    ``config`` is the dataset's QualityConfig with its ``deadline_hours``.
    """
    preload_great_expectations()
    store, days = storage.store(), DayRecorder(context)
    limit = quarantine_limit(config.max_quarantine_rate, config.quarantine_floor_rows)
    dates = partition_dates(context)
    record_landing_read(context, store, spec.dataset, dates)
    for date in dates:
        yield from land_day(context, spec, config, store, date, limit, days)
    yield from days.finish()


def land_day(
    context: AssetExecutionContext,
    spec: LandingSpec,
    config: QualityConfig,
    store: DataStore,
    date: str,
    limit: Any,
    days: DayRecorder,
) -> Iterator[Any]:
    """Checks and screens one day and records it (with its companions), through ``days``.

    The day's metadata names the files it was checked against (their fingerprint) and whether
    its blocking checks passed: :func:`unchecked` reads both back.
    """
    fingerprint = store.landing_fingerprint(spec.dataset, date)
    landed = landing_day(context, store, spec.dataset, spec.schema, date)
    with fail_fast_on_bad_input():
        screen = spec.screen(store, date, config, limit)
    plan = screen.plan
    if plan.count:
        context.log.warning(
            f"{spec.dataset} {date}: {plan.count} of {plan.rows} rows to quarantine "
            f"({plan.rate:.2%}, limit {limit.describe(plan.rows)}): {plan.describe()}"
        )
    checks = spec.gate.check_results(
        store,
        {date: screen},
        max_quarantine_rate=limit,
        deadline_hours=config.deadline_hours,
        sample_rows=config.check_sample_rows,
        seed=config.check_seed,
    )
    failed = [c.check_name for c in checks if _blocks(spec, c)]
    with fail_fast_on_bad_input():  # a storage layout it cannot write to fails once
        published = dict(spec.publish(store, date, screen, config, limit)) if spec.publish else {}
    metadata = {
        **landed,
        "rows_to_quarantine": plan.count,
        "quarantine_reasons": MetadataValue.json(plan.counts()),
        LANDING_FINGERPRINT: fingerprint or "",
        CHECKED: "failed: " + ", ".join(failed) if failed else PASSED,
        **published.pop(spec.dataset, {}),
    }
    yield from days.record(spec.dataset, date, metadata, checks)
    for asset, companion in published.items():
        yield from days.record(asset, date, companion)


def _blocks(spec: LandingSpec, result: AssetCheckResult) -> bool:
    suite = spec.gate.suites.get(result.check_name or "")
    severity = result.severity.value if result.severity else "ERROR"
    return not result.passed and suite is not None and suite.blocking and severity == "ERROR"
