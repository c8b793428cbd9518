"""The one scoring runner: every nightly batch-inference asset is a spec and a few lines.

A domain says how to score one day (:class:`ScoringSpec`): how to load its model, and for a
date how to read and screen the input, prepare batches, run the model and check the output
(:class:`Day`). The runner does what every scoring asset does: the loop over the run's days (one,
or a range backfill's), spot-safe execution and the exactly-once commit, error mapping,
quarantine limits, data-quality gates, and each day's own materialisation and check results as
soon as that day is committed.

Each day is its own event: in a range backfill a 10,000-row day records its own
``dagster/row_count``, output, quarantine, throughput and model version, and its own check
results (partitioned checks), instead of the range's totals. A day that fails leaves the days
before it materialised; a retry of the run finds those days committed by its lineage and
neither redoes nor records them again, so it redoes only the failed days.
"""

from __future__ import annotations

import datetime as dt
import inspect
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    AssetSpec,
    Failure,
    MetadataValue,
    Output,
)

from assets.checkpointing import SpotSafeRun, spot_safe
from assets.day_metadata import day_figures, day_metadata
from assets.days import DayRecorder, daily_assets, latest_materialization
from assets.errors import fail_fast_on_bad_input
from assets.handed import SNAPSHOTS
from assets.landing import (
    LandedDay,
    jobs_holding,
    land_for_scoring,
    landing_timezone_metadata,
    record_landing_read,
)
from assets.observability import observability_metadata
from assets.partitions import PartitionReport, checkpoint_totals, partition_dates
from assets.staleness import load_chosen, model_window
from inference.engine.tables import StagedDay
from inference.engine.work import Work
from policy.automation import GPU_POOL, scored_by_0700_utc
from policy.tags import PIPELINE_TAG
from resources.inference import InferenceResource
from resources.quality import (
    CheckSuite,
    QualityConfig,
    StreamedSample,
    conservation_figures,
    fail_fast_on_bad_rows,
    preload_great_expectations,
    quarantine_limit,
    quarantine_metadata,
)
from resources.storage import DataStore, StorageResource

ConfigT = TypeVar("ConfigT", bound=QualityConfig)


@dataclass(frozen=True)
class Model:
    """A loaded model as the runner sees it.

    Args:
        version: recorded on every output row and materialisation.
        key: the inference resource's cache key: a range backfill loads the model once.
        value: what the domain's ``day`` uses (a scorer, a recommender, a summariser).
        device: where it runs (default: the inference resource's device).
        metadata: run-wide facts recorded on every day's materialisation.
    """

    version: str
    key: str
    value: Any
    device: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Day:
    """One day's scoring as a domain describes it: the work, and what follows its commit.

    Args:
        work: what the spot-safe engine runs (input stream, model step, quarantine, ...).
        checks: the day's check results from its report (``report.conservation`` holds the
            engine's row counts: landed, in, scored, quarantined, published).
        metadata: the day's own figures for its materialisation (flagged rows, model calls).
        on_commit: anything the domain records once the day is committed.
        input_rows: the rows the day's output answers for, where they are not the landing
            day's (recommendations: one list per user of the audience).
    """

    work: Work
    checks: Callable[[PartitionReport], Sequence[AssetCheckResult]]
    metadata: Callable[[PartitionReport], Mapping[str, Any]] = lambda report: {}
    on_commit: Callable[[PartitionReport], None] | None = None
    input_rows: int | None = None


@dataclass(frozen=True)
class ScoringSpec(Generic[ConfigT]):
    """What a batch-inference asset is made of.

    Args:
        asset: the output asset (``outputs/<asset>/date=D/``).
        dataset: the landing dataset it reads (its reads are fingerprinted for the sensor).
        suites: the output's check suites (``assets/<domain>/suites``).
        load: ``(store, inference, config) -> Model``; a missing or unusable model fails the
            step at once, before any input is read.
        day: ``(run, landed, model, config, max_quarantine_rate) -> Day``, given the day as
            the landing stage handed it (its date, rows and the listing the step scores).
        checks: the output's checks beside its suites, evaluated per day by ``Day.checks``.
    """

    asset: str
    dataset: str
    suites: Mapping[str, CheckSuite]
    load: Callable[[DataStore, InferenceResource, ConfigT], Model]
    day: Callable[[SpotSafeRun, LandedDay, Model, ConfigT, float], Day]
    checks: Sequence[AssetCheckSpec] = ()


def scoring_asset(
    spec: ScoringSpec,
    *,
    deps: Sequence[Any],
    group: str,
    kinds: set[str] | None = None,
) -> Callable[[Callable[..., Any]], AssetsDefinition]:
    """Declares a daily-partitioned scoring asset; the decorated function's docstring is its
    description and its body is ``yield from score(context, spec, config, storage, inference)``.

    Checks are partitioned: each day gets its own result for each suite.
    """

    def decorate(fn: Callable[..., Any]) -> AssetsDefinition:
        output = AssetSpec(
            spec.asset,
            deps=deps,
            description=inspect.cleandoc(fn.__doc__ or ""),
            group_name=group,
            kinds=kinds or {"pytorch", "parquet"},
            freshness_policy=scored_by_0700_utc,
        )
        checks = [*(suite.spec() for suite in spec.suites.values()), *spec.checks]
        return daily_assets(output, checks=checks, pool=GPU_POOL)(fn)

    return decorate


def score(
    context: AssetExecutionContext,
    spec: ScoringSpec[ConfigT],
    config: ConfigT,
    storage: StorageResource,
    inference: InferenceResource,
) -> Iterator[AssetMaterialization | AssetCheckEvaluation | Output]:
    """Scores every day of the run, yielding each day's materialisation and check results as
    soon as it is committed; a failed blocking check fails the step once all days are done."""
    preload_great_expectations()
    label_asset_job_run(context, spec.asset)
    store = storage.store()
    dates = partition_dates(context)
    record_landing_read(context, store, spec.dataset, dates)
    with fail_fast_on_bad_input():
        model, choice = load_chosen(spec.load, store, inference, config, context.run.tags, dates)
    window = model_window(store, model.version)  # one manifest read, whatever the days
    limit = quarantine_limit(config.max_quarantine_rate, config.quarantine_floor_rows)
    days = DayRecorder(context)
    with spot_safe(context, store, inference) as run:
        for date in dates:
            with fail_fast_on_bad_input():
                landed = yield from land_for_scoring(
                    context, spec.asset, spec.dataset, config, store, date, limit
                )
            with fail_fast_on_bad_input(), fail_fast_on_bad_rows():
                day = spec.day(run, landed, model, config, limit)
                sample = _prepare(day.work, spec, landed, config, limit)
                # After the domain's own screening, whose message names the rows' figures.
                if landed.refusal is not None:
                    raise Failure(description=landed.refusal, allow_retries=False)
                report = run.partition(spec.asset, date, day.work, sample, audit=True)
            scored = scoring_metadata(
                report,
                model_version=model.version,
                device=model.device or inference.runtime.describe(),
                model_loads=inference.load_count(model.key),
                window=window,
                choice=choice,
            )
            if _recorded_before(context, spec.asset, report):
                continue
            staged = report.shards.staged if report.shards is not None else None
            # Write-audit-publish: what the domain records at the commit, its figures and the
            # checks read the day as staged, before main has it.
            with store.reading(staged):
                started = time.perf_counter()  # the checks' cost: their figures, then suites
                if report.shards is not None:
                    landed_rows = landed.rows if day.input_rows is None else day.input_rows
                    rows = conservation_figures(store, spec.asset, date, report.shards, landed_rows)
                    report = replace(report, conservation=rows)
                check_seconds = time.perf_counter() - started
                if day.on_commit is not None:
                    day.on_commit(report)
                own = day.metadata(report)
                started = time.perf_counter()
                checks = day.checks(report)
                check_seconds = round(check_seconds + time.perf_counter() - started, 4)
            refused = days.refused(checks)
            verdicts = {str(c.check_name): bool(c.passed) for c in checks}
            outcome = publish_or_reject(
                context, store, spec.asset, date, staged, refused, verdicts, model.version
            )
            figures = {
                **scored,
                **run.metadata(),
                **landing_timezone_metadata(store, spec.dataset),
                **model.metadata,
                **own,
                **quarantine_metadata([report.shards] if report.shards else []),
                "partitions": len(dates),  # days this run covers
                "check_seconds": check_seconds,
                "model_version_changed": _model_version_changed(
                    context, spec.asset, date, model.version
                ),
            }
            if report.shards is not None:
                figures["commit"] = report.shards.commit
            figures.update(outcome)
            # The day's Prometheus series take its recorded figures, and are pushed.
            if (metrics := run.day_metrics.get((spec.asset, date))) is not None:
                metrics.finish(figures, report.metrics, report.gpu)
            yield from days.record(
                spec.asset, date, day_metadata(figures), checks, why=outcome.get("main")
            )
    yield from days.finish()


def publish_or_reject(
    context: AssetExecutionContext,
    store: DataStore,
    asset: str,
    date: str,
    staged: StagedDay | None,
    refused: Sequence[str],
    checks: dict[str, bool],
    model_version: str,
) -> dict[str, Any]:
    """Publishes a staged day whose blocking checks passed; keeps one they refused off main,
    on a branch of its own. Returns the figures that say which (the snapshot ids, and what
    main holds for the day)."""
    if staged is None:
        return {}
    if not refused:
        published = staged.publish(checks=checks, model_version=model_version)
        if published is None:
            return {}
        # The downstream assets read the day at these snapshots (assets/handed.py).
        return {"snapshot_id": published.snapshot_id, SNAPSHOTS: dict(staged.published_ids)}
    branch = staged.reject()
    current = store.output_figures(asset, date)
    holds = (
        f"main keeps commit {current.commit} (snapshot {current.snapshot_id})"
        if current is not None
        else "main has no day"
    )
    why = (
        f"not published: the staged day (commit {staged.commit}, snapshot "
        f"{staged.snapshot_id}) is kept on branch {branch} of table "
        f"{store.tables.identifier(asset)}; {holds}"
    )
    context.log.error(f"{asset} {date}: blocking check(s) {', '.join(refused)} failed; {why}")
    return {"rejected_snapshot_id": staged.snapshot_id, "rejected_branch": branch, "main": why}


def _prepare(
    work: Work, spec: ScoringSpec, landed: LandedDay, config: QualityConfig, limit: float
) -> StreamedSample | None:
    """What every day's work gets before it runs: its input files (by default the landing
    files whose fingerprint the landing check was compared with, where the domain did not
    name its own), the quarantine limit (above it the day fails before any inference) and, if
    it asks for one, the output checks' sample taken as rows stream."""
    if work.input.files is None:
        work.input.files = landed.read.files
    plan = work.input.quarantine
    if plan is None:
        return None
    plan.check_rate(limit, f"{spec.asset} {landed.date}")
    if not work.output.sample:
        return None
    return StreamedSample(plan.rows - plan.count, config.check_sample_rows, config.check_seed)


def _recorded_before(context: AssetExecutionContext, asset: str, report: PartitionReport) -> bool:
    """Whether this day was committed by an earlier attempt of this run's lineage and that
    attempt's materialisation of exactly this commit is already recorded: nothing to redo."""
    shards = report.shards
    if shards is None or not shards.already_committed:
        return False
    latest = latest_materialization(context, asset, report.date)
    if latest is None:
        return False
    if day_figures(latest.asset_materialization.metadata).get("commit") != shards.commit:
        return False
    context.log.info(
        f"{asset} {report.date}: committed and recorded by run {latest.run_id} of this "
        "lineage; not redone"
    )
    return True


def _model_version_changed(
    context: AssetExecutionContext, asset: str, date: str, version: str
) -> int:
    """1 when the day before was last scored by another model version, else 0: plotted over
    the partitions, it marks where a new champion took over."""
    before = (dt.date.fromisoformat(date) - dt.timedelta(days=1)).isoformat()
    latest = latest_materialization(context, asset, before)
    if latest is None:
        return 0
    previous = day_figures(latest.asset_materialization.metadata).get("model_version")
    return int(previous is not None and previous != version)


def scoring_metadata(
    report: PartitionReport,
    *,
    model_version: str,
    device: str,
    model_loads: int,
    window: tuple[str, str] | None = None,
    choice: str | None = None,
) -> dict:
    """A scored day's materialisation metadata, which the UI plots per partition: rows, time,
    throughput, batches, checkpoint figures, model, device, and, given the backfill's model
    ``choice``, the model's data window against the day (:func:`point_in_time`)."""
    metadata: dict = {
        **observability_metadata(
            report.metrics,
            device=device,
            price=report.price,
            capacity=report.capacity,
            gpu=report.gpu,
        ),
        **checkpoint_totals([report]),
        "dagster/row_count": report.metrics.rows_out,
        "model_version": model_version,
        "device": device,
        "model_loads": model_loads,
        "output": MetadataValue.path(report.published.uri),
        **report.executor,
        **(point_in_time(window, report.date, choice) if choice is not None else {}),
    }
    return metadata


def point_in_time(window: tuple[str, str] | None, date: str, choice: str) -> dict[str, object]:
    """What a scored day records of its model's data window and of the backfill's choice.

    ``trained_through`` is the last day the model trained on; ``trained_after_day`` is true
    when that day is after ``date``: the model saw data from the day's future. Both are absent
    without a window (:func:`assets.staleness.model_window`).
    """
    figures: dict[str, object] = {"model_choice": choice}
    if window is not None:
        figures["trained_from"], figures["trained_through"] = window
        figures["trained_after_day"] = window[1] > date
    return figures


def label_asset_job_run(context: AssetExecutionContext, asset: str) -> None:
    """Tags a run of Dagster's hidden asset job with the pipeline jobs that hold ``asset``.

    Dagster 1.13's UI launches an asset's page as ``__ASSET_JOB`` (it picks the first of the
    asset's job names, and the hidden job sorts first), and its partition pane shows
    "Job: None" for that job; a range launched as ``fraud_scoring_job`` instead would be a job
    backfill, one run per day. The tag names the pipeline on the run's page and in the run
    list's filter.
    """
    if not context.job_name.startswith("__ASSET_JOB") or PIPELINE_TAG in context.run.tags:
        return
    jobs = jobs_holding(context, {AssetKey(asset)})
    if jobs:
        context.instance.add_run_tags(context.run_id, {PIPELINE_TAG: ", ".join(jobs)})
