"""The one landing runner: every source dataset is a spec and a few lines.

A landing asset checks each day of the run on its own: the files carry the contract's columns
and types (a missing day or a malformed file fails here, naming the dataset, date, file and
column), every row is screened against the contract (what scoring will quarantine, and why),
and the dataset's suites judge the screening; each day is then recorded with its own rows,
quarantine figures and check results. Every step that reads a landing day, landing or
scoring, records the fingerprint of the files it read (:func:`record_landing_read`), which the
landing sensor compares with the files there now.

A scoring asset's day is scored only over a landing day that was checked against these files.
A person who backfills ``fraud_scores`` alone from its page (or materialises it alone) selects
no landing asset: Dagster runs only the scoring step. Left there, the scored days would sit
over ``transactions`` days that were never materialised and whose checks never ran, and the UI
would show every one of them as unsynced. So the scoring step lands such a day itself
(:func:`land_for_scoring`), with the same code the landing asset runs: the landing day (and its
companions, the saved screen) is materialised and its checks are recorded in the same run,
before the day is scored; a day whose blocking landing checks fail is not scored. A day
already landed and checked against the same files (in this run's landing step, or an earlier
run) is not landed again.

Why land rather than refuse: the landing code is the domain's one :class:`LandingSpec`, which
every domain declares (fraud, recommendations, summaries, embeddings), so this holds for all
of them, and a backfill from any asset page ends with the graph consistent instead of failed.
A dataset without a spec that says how to land it fails the day naming what to materialise.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    Failure,
    MetadataValue,
)
from dagster_shared.check import CheckError
from pydantic import Field

from assets.day_metadata import day_figures
from assets.days import DayRecorder, latest_materialization
from assets.errors import fail_fast_on_bad_input
from assets.gates import LandingGate, Screen
from assets.partitions import partition_dates
from resources.landing_files import NOT_PARQUET_ENV, LandingListing, LandingRead
from resources.quality import QualityConfig, preload_great_expectations, quarantine_limit
from resources.storage import DataStore, StorageResource

# Every landing dataset's spec by name, filled as the domains declare them (at import), so that
# a scoring asset can land its input's day in its own step (:func:`land_for_scoring`).
LANDINGS: dict[str, LandingSpec] = {}

# What a landing day's metadata says about the check it had: the files' fingerprint, and
# whether its blocking checks passed.
CHECKED, PASSED = "landing_checks", "passed"
# The day's rows, under the name Dagster's UI shows.
ROW_COUNT = "dagster/row_count"

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
            was never checked (see :func:`land_for_scoring`).
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
) -> Generator[Any, None, int]:
    """Checks and screens one day and records it (with its companions), through ``days``;
    returns its rows.

    The day's metadata names the files it was checked against (their fingerprint) and whether
    its blocking checks passed: :func:`checked_rows` reads both back.
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
    return int(landed[ROW_COUNT])


def _blocks(spec: LandingSpec, result: AssetCheckResult) -> bool:
    suite = spec.gate.suites.get(result.check_name or "")
    severity = result.severity.value if result.severity else "ERROR"
    return not result.passed and suite is not None and suite.blocking and severity == "ERROR"


# -- what every landing read records -------------------------------------------------------
# The metadata key of the observation recording which landing files a step read.
LANDING_FINGERPRINT = "landing_fingerprint"


def record_landing_read(
    context: AssetExecutionContext, store: DataStore, dataset: str, dates: list[str]
) -> None:
    """Records on the landing asset, before reading, which files each partition has (their
    fingerprint), whether the step then succeeds or fails: the landing sensor relaunches a day
    only when its files differ from the ones a run last read."""
    for date in dates:
        fingerprint = store.landing_fingerprint(dataset, date)
        if fingerprint is not None:
            context.log_event(
                AssetObservation(
                    asset_key=AssetKey(dataset),
                    partition=date,
                    metadata={
                        LANDING_FINGERPRINT: fingerprint,
                        "read_by": context.op_def.name,
                    },
                )
            )


def landing_day(
    context: AssetExecutionContext, store: DataStore, dataset: str, schema: pa.Schema, date: str
) -> dict:
    """Validates one day of a landing dataset against its contract and counts its rows.

    Every source asset materialises through this, so a missing day or a malformed file fails
    before any model runs, naming the dataset, date, file and column. Every file below the
    partition folder is read as parquet (by its bytes, whatever its name), or skipped and
    named in the log and counted in ``landing_files_skipped``: names Spark and Hadoop skip
    (``_SUCCESS``, ``_temporary/``, ``.crc``, ``*._COPYING_``, ``*.tmp``), and files that are
    not parquet or repeat another's bytes when ``NIGHTSHIFT_LANDING_NOT_PARQUET=skip`` (else
    such a file fails the day, naming it). A broken link fails the day whatever the policy.
    Columns read with a cast beyond widening (a decimal as the contract's float, a
    dictionary-encoded column as its values) are logged and listed in ``landing_casts``.

    Returns:
        the day's materialisation metadata.
    """
    with fail_fast_on_bad_input():
        rows = store.count_landing(dataset, date, schema)
        casts = store.landing_casts(dataset, date, schema)
    folder = store.landing_path(dataset, date)
    listing = store.landing_listing(dataset, date)
    context.log.info(
        f"{dataset} {date}: {rows} rows in {len(listing.files)} parquet file(s) at "
        f"{store.uri(folder)}"
    )
    _log_skipped(context, f"{dataset} {date}", folder, listing)
    if casts:
        named = ", ".join(f"{cast} ({files} file(s))" for cast, files in casts.items())
        context.log.info(f"{dataset} {date}: columns read with a cast to the contract: {named}")
    return {
        ROW_COUNT: rows,
        **landing_timezone_metadata(store, dataset),
        "landing_casts": MetadataValue.json(casts),
        "landing_files_skipped": len(listing.skipped),
        "output": MetadataValue.path(store.uri(folder)),
    }


def _log_skipped(
    context: AssetExecutionContext, day: str, folder: str, listing: LandingListing
) -> None:
    """Names every skipped file: not-data names at INFO, files that are not parquet or repeat
    another (skipped by the ``skip`` policy: rows a writer may have meant to land, or a copy)
    at WARNING."""
    foreign = listing.not_parquet if listing.policy == "skip" else {}
    copies = listing.duplicates if listing.policy == "skip" else {}
    not_data = [path for path in listing.skipped if path not in foreign and path not in copies]
    if not_data:
        names = ", ".join(path[len(folder) + 1 :] for path in not_data)
        context.log.info(
            f"{day}: skipped {len(not_data)} file(s) that are not data (names Spark and "
            f"Hadoop skip: '_*', '.*', '*._COPYING_', '*.tmp', '*.crc'): {names}"
        )
    if copies:
        names = ", ".join(
            f"{path[len(folder) + 1 :]} (repeats {first[len(folder) + 1 :]})"
            for path, first in copies.items()
        )
        context.log.warning(
            f"{day}: skipped {len(copies)} file(s) with the same bytes as another file of the "
            f"day ({NOT_PARQUET_ENV} / landing_not_parquet: skip): {names}"
        )
    if foreign:
        names = ", ".join(f"{path[len(folder) + 1 :]} ({what})" for path, what in foreign.items())
        context.log.warning(
            f"{day}: skipped {len(foreign)} file(s) that are not parquet "
            f"({NOT_PARQUET_ENV} / landing_not_parquet: skip): {names}"
        )


def landing_timezone_metadata(store: DataStore, dataset: str) -> dict[str, str]:
    """How the dataset's timestamps without a time zone were read: as wall-clock time in the
    configured zone, or not at all (a file with them fails the run)."""
    return {"landing_timezone": store.landing_timezone(dataset) or "none (naive rejected)"}


@dataclass(frozen=True)
class LandedDay:
    """A scoring step's input day, landed and checked: its rows (as the landing check counted
    them), why it must not be scored (its blocking landing checks failed) or None, and the
    listing its check was made against, whose files the step scores."""

    date: str
    rows: int
    refusal: str | None
    read: LandingRead


def land_for_scoring(
    context: AssetExecutionContext,
    asset: str,
    dataset: str,
    config: QualityConfig,
    store: DataStore,
    date: str,
    limit: Any,
) -> Generator[Any, None, LandedDay]:
    """The scoring step's input day: landed and checked in this step first unless it was
    checked against its current files. One listing of the day gives both the fingerprint
    compared and the files the step scores, so it scores exactly the files that were checked.

    Args:
        asset: the scoring asset, for messages.
        config: the scoring asset's config: its quality settings (limit, sample, seed and the
            domain's own, e.g. the amount ceiling) apply to the landing day too.

    Returns:
        the day, with why it must not be scored where its blocking landing checks failed.
    """
    failed: list[str] = []
    read = store.landing_read(dataset, date, kept=True)
    rows = checked_rows(context, dataset, date, read.fingerprint)
    if rows is None:
        spec = LANDINGS.get(dataset)
        if spec is None or spec.config is None:
            how = how_to_land(context, asset, dataset, [date])
            raise Failure(description=how, allow_retries=False)
        context.log.info(
            f"{asset} {date}: {dataset} {date} was not materialised and checked against its "
            f"current files; landing it in this step first"
        )
        days = DayRecorder(context, blocking=spec.blocking)
        landing_config = _landing_config(spec, config)
        rows = yield from land_day(context, spec, landing_config, store, date, limit, days)
        failed = [failure.rsplit(": ", 1)[-1] for failure in days.failed]
        read = store.landing_read(dataset, date, kept=True)  # the files this step just checked
    refusal = (
        f"{asset} {date}: not scored: blocking checks of {dataset} {date} failed "
        f"({', '.join(failed)}); see their results on {dataset}'s page, fix the landing files "
        "and run this again"
        if failed
        else None
    )
    return LandedDay(date, rows, refusal, read)


def checked_rows(
    context: AssetExecutionContext, dataset: str, date: str, fingerprint: str | None
) -> int | None:
    """The dataset's day's rows where it was last materialised from the files of
    ``fingerprint`` with its blocking checks passed; else None."""
    latest = latest_materialization(context, dataset, date)
    if latest is None:
        return None
    figures = day_figures(latest.asset_materialization.metadata)
    if figures.get(LANDING_FINGERPRINT) != (fingerprint or "") or figures.get(CHECKED) != PASSED:
        return None
    return int(figures[ROW_COUNT])


def how_to_land(
    context: AssetExecutionContext, asset: str, dataset: str, dates: Sequence[str]
) -> str:
    """Which upstream days to materialise before ``asset`` can score ``dates``, and how."""
    graph = context.job_def.asset_layer.asset_graph
    key = AssetKey(asset)
    parents = graph.get(key).parent_keys if graph.has(key) else set()
    companions = [
        k for k in parents if graph.has(k) and AssetKey(dataset) in graph.get(k).parent_keys
    ]
    upstream = [dataset, *sorted(k.to_user_string() for k in companions)]
    days = dates[0] if len(dates) == 1 else f"{dates[0]}..{dates[-1]}"
    jobs = jobs_holding(context, {key, AssetKey(dataset)})
    launch = f", or launch {' or '.join(jobs)} for them" if jobs else ""
    return (
        f"{asset} {days}: its input {dataset} was not materialised and checked for "
        f"{'this day' if len(dates) == 1 else 'these days'}: materialise "
        f"{' and '.join(upstream)} for {days}{launch}"
    )


def jobs_holding(context: AssetExecutionContext, keys: set[AssetKey]) -> list[str]:
    """The named jobs that materialise all of ``keys``; none outside a code location."""
    try:
        repository = context.repository_def
    except CheckError:  # materialize() and execute_in_process run without a repository
        return []
    return sorted(
        job.name
        for job in repository.get_all_jobs()
        if not job.name.startswith("__") and keys <= job.asset_layer.selected_asset_keys
    )


def _landing_config(spec: LandingSpec, config: QualityConfig) -> QualityConfig:
    """The landing asset's config (its own defaults, e.g. its deadline) with the scoring
    asset's quality settings wherever both have them."""
    assert spec.config is not None
    fields = spec.config.model_fields
    shared = {k: v for k, v in config.model_dump().items() if k in fields}
    return spec.config(**shared)
