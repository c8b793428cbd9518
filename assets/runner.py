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

import inspect
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    AssetSpec,
    Output,
    multi_asset,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluation,
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.source_asset import (
    SYSTEM_METADATA_KEY_SOURCE_ASSET_OBSERVATION as NO_ASSET_EVENTS,
)
from dagster._core.errors import DagsterAssetCheckFailedError
from dagster._core.storage.event_log.base import AssetRecordsFilter
from dagster._utils.warnings import PreviewWarning

from assets.checkpointing import SpotSafeRun, Work, spot_safe
from assets.common import (
    PartitionReport,
    fail_fast_on_bad_input,
    landing_timezone_metadata,
    log_partition,
    partition_dates,
    record_landing_read,
    scoring_metadata,
)
from policy.automation import GPU_POOL, scored_by_0700_utc
from policy.partitions import backfill_policy, daily_partitions
from resources.inference import InferenceResource
from resources.quality import (
    CheckSuite,
    QualityConfig,
    fail_fast_on_bad_rows,
    preload_great_expectations,
    quarantine_limit,
    quarantine_metadata,
)
from resources.storage import DataStore, StorageResource

ConfigT = TypeVar("ConfigT", bound=QualityConfig)
ERROR = AssetCheckSeverity.ERROR


class _GatedHere(logging.Filter):
    """Drops Dagster's warning that a blocking check of a scoring asset "emitted no result":
    the runner yields each day's result as an event and fails the step itself when a blocking
    one fails, so downstream steps are gated all the same."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "emitted no result in step" not in record.getMessage()


logging.getLogger("dagster._core.execution.plan.active").addFilter(_GatedHere())


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
        checks: the day's check results from its report.
        metadata: the day's own figures for its materialisation (flagged rows, model calls).
        on_commit: anything the domain records once the day is committed.
    """

    work: Work
    checks: Callable[[PartitionReport], Sequence[AssetCheckResult]]
    metadata: Callable[[PartitionReport], Mapping[str, Any]] = lambda report: {}
    on_commit: Callable[[PartitionReport], None] | None = None


@dataclass(frozen=True)
class ScoringSpec(Generic[ConfigT]):
    """What a batch-inference asset is made of.

    Args:
        asset: the output asset (``outputs/<asset>/date=D/``).
        dataset: the landing dataset it reads (its reads are fingerprinted for the sensor).
        suites: the output's check suites (``assets/<domain>/suites``).
        load: ``(store, inference, config) -> Model``; a missing or unusable model fails the
            step at once, before any input is read.
        day: ``(run, date, model, config, max_quarantine_rate) -> Day``.
    """

    asset: str
    dataset: str
    suites: Mapping[str, CheckSuite]
    load: Callable[[DataStore, InferenceResource, ConfigT], Model]
    day: Callable[[SpotSafeRun, str, Model, ConfigT, float], Day]


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
        checks = [suite.spec() for suite in spec.suites.values()]
        return daily_assets(output, checks=checks, pool=GPU_POOL)(fn)

    return decorate


def per_day(check: AssetCheckSpec) -> AssetCheckSpec:
    """The check, evaluated once per daily partition.

    Partitioned checks are a preview feature of Dagster 1.13 (its warning is silenced here,
    where the choice is made); tests/test_ui_graphql.py checks each day's result in the UI.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PreviewWarning)
        return AssetCheckSpec(
            check.name,
            asset=check.asset_key,
            description=check.description,
            blocking=check.blocking,
            metadata=check.metadata,
            partitions_def=daily_partitions,
        )


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
    store = storage.store()
    dates = partition_dates(context)
    record_landing_read(context, store, spec.dataset, dates)
    with fail_fast_on_bad_input():
        model = spec.load(store, inference, config)
    limit = quarantine_limit(config.max_quarantine_rate)
    days = DayRecorder(context)
    with spot_safe(context, store, inference) as run:
        for date in dates:
            with fail_fast_on_bad_input(), fail_fast_on_bad_rows():
                day = spec.day(run, date, model, config, limit)
                report = run.partition(spec.asset, date, day.work)
            log_partition(context, spec.asset, report)
            if day.on_commit is not None:
                day.on_commit(report)
            if _recorded_before(context, spec.asset, report):
                continue
            started = time.perf_counter()
            checks = day.checks(report)
            metadata = {
                **scoring_metadata(
                    [report],
                    model_version=model.version,
                    device=model.device or inference.runtime.describe(),
                    model_loads=inference.load_count(model.key),
                ),
                **run.metadata(),
                **landing_timezone_metadata(store, spec.dataset),
                **model.metadata,
                **day.metadata(report),
                **quarantine_metadata([report.shards] if report.shards else []),
                "partitions": len(dates),  # days this run covers
                "check_seconds": round(time.perf_counter() - started, 4),
            }
            if report.shards is not None:
                metadata["commit"] = report.shards.commit
            yield from days.record(spec.asset, date, metadata, checks)
    yield from days.finish()


class DayRecorder:
    """Records each day of a run on its own as soon as it is done: its materialisation of each
    asset and its check results (partitioned checks), instead of one event for the range.

    ``finish`` ends the step: it fails it when a blocking check failed on any day (nothing
    downstream runs), and otherwise yields the step's outputs so that downstream steps of the
    same run go ahead.
    """

    def __init__(self, context: AssetExecutionContext):
        self.context = context
        self.blocking = {c.name for c in context.assets_def.check_specs if c.blocking}
        self.failed: list[str] = []

    def record(
        self,
        asset: str,
        date: str,
        metadata: Mapping[str, Any],
        checks: Sequence[AssetCheckResult] = (),
    ) -> Iterator[AssetMaterialization | AssetCheckEvaluation]:
        yield AssetMaterialization(asset, partition=date, metadata=metadata)
        for result in checks:
            evaluation = _evaluation(self.context, asset, date, result, self.blocking)
            if evaluation.blocking and not evaluation.passed and evaluation.severity == ERROR:
                self.failed.append(f"{asset} {date}: {evaluation.check_name}")
            yield evaluation

    def finish(self) -> Iterator[Output]:
        if self.failed:
            raise DagsterAssetCheckFailedError(
                f"{len(self.failed)} blocking asset check(s) failed with ERROR severity; "
                "nothing downstream of these days runs:\n" + "\n".join(self.failed)
            )
        # Without asset events of their own (each day was recorded above): Dagster 1.13 skips
        # an output's asset events when this key is in its metadata
        # (dagster/_core/execution/plan/execute_step.py). tests/test_fraud_pipeline.py checks
        # one materialisation per day, and the alerts made in the same run.
        assets_def = self.context.assets_def
        for key in _dependencies_first(assets_def, self.context.selected_asset_keys):
            yield Output(
                None,
                output_name=assets_def.get_output_name_for_asset_key(key),
                metadata={NO_ASSET_EVENTS: True},
            )


def _dependencies_first(
    assets_def: AssetsDefinition, keys: AbstractSet[AssetKey]
) -> list[AssetKey]:
    """The keys in an order Dagster accepts outputs in: each after those it depends on."""
    ordered: list[AssetKey] = []
    pending = sorted(keys)
    while pending:
        ready = [k for k in pending if not (assets_def.asset_deps[k] & set(pending))]
        ordered += ready
        pending = [k for k in pending if k not in ready]
    return ordered


def daily_assets(
    *specs: AssetSpec, checks: Sequence[AssetCheckSpec] = (), pool: str | None = None
) -> Callable[[Callable[..., Any]], AssetsDefinition]:
    """Declares daily-partitioned assets whose function records each day with a DayRecorder;
    each check is evaluated once per day."""
    return multi_asset(
        specs=[
            s.replace_attributes(skippable=True, partitions_def=daily_partitions) for s in specs
        ],
        check_specs=[per_day(check) for check in checks],
        backfill_policy=backfill_policy,
        pool=pool,
        # Outputs are events, one per day; none is an IO-managed value.
        can_subset=True,
    )


def _recorded_before(context: AssetExecutionContext, asset: str, report: PartitionReport) -> bool:
    """Whether this day was committed by an earlier attempt of this run's lineage and that
    attempt's materialisation of exactly this commit is already recorded: nothing to redo."""
    shards = report.shards
    if shards is None or not shards.already_committed:
        return False
    latest = _latest(context, asset, report.date)
    if latest is None:
        return False
    recorded = latest.asset_materialization.metadata.get("commit")
    if recorded is None or recorded.value != shards.commit:
        return False
    context.log.info(
        f"{asset} {report.date}: committed and recorded by run {latest.run_id} of this "
        "lineage; not redone"
    )
    return True


def _latest(context: AssetExecutionContext, asset: str, date: str):
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[date]), limit=1
    ).records
    return records[0] if records else None


def _evaluation(
    context: AssetExecutionContext,
    asset: str,
    date: str,
    result: AssetCheckResult,
    blocking: set[str],
) -> AssetCheckEvaluation:
    """A check result as the day's own evaluation, against the day's materialisation."""
    latest = _latest(context, asset, date)
    target = (
        AssetCheckEvaluationTargetMaterializationData(
            run_id=latest.run_id, storage_id=latest.storage_id, timestamp=latest.timestamp
        )
        if latest is not None
        else None
    )
    return AssetCheckEvaluation(
        asset_key=result.asset_key or AssetKey(asset),
        check_name=result.check_name,
        passed=result.passed,
        metadata=result.metadata,
        target_materialization_data=target,
        severity=result.severity,
        description=result.description,
        blocking=result.check_name in blocking,
        partition=date,
    )
