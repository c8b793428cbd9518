"""Each day of a run recorded on its own: its materialisation of each asset and its check
results, as soon as the day is done, instead of one event for a range backfill's totals.

Dagster 1.13 records one materialisation per partition of a step's output, all with the same
metadata, when the step ends (open feature requests #21072, #18123, #17836). Here an asset's
function yields an ``AssetMaterialization(partition=D)`` and partitioned check evaluations for
each day as it finishes (:class:`DayRecorder`), and at the end the step's outputs without asset
events of their own, so that downstream steps of the same run go ahead. A day that fails
leaves the days before it recorded.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    AssetsDefinition,
    AssetSpec,
    DagsterEventType,
    Output,
    PreviewWarning,
    multi_asset,
)

from assets.dagster_private import (
    CODE_VERSION_TAG,
    DATA_VERSION_IS_USER_PROVIDED_TAG,
    DATA_VERSION_TAG,
    DEFAULT_DATA_VERSION,
    NO_ASSET_EVENTS,
    NULL_EVENT_POINTER,
    AssetCheckEvaluationTargetMaterializationData,
    DagsterAssetCheckFailedError,
    data_version_of,
    input_data_version_tag,
    input_event_pointer_tag,
)
from policy.partitions import backfill_policy, daily_partitions

ERROR = AssetCheckSeverity.ERROR


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


class DayRecorder:
    """Records each day of a run on its own as soon as it is done: its materialisation of each
    asset and its check results (partitioned checks), instead of one event for the range.

    ``finish`` ends the step: it fails it when a blocking check failed on any day (nothing
    downstream runs), and otherwise yields the step's outputs so that downstream steps of the
    same run go ahead.

    Args:
        blocking: the blocking checks' names, default this step's; a step that records
            another asset's days (scoring that lands its input) passes that asset's.
    """

    def __init__(self, context: AssetExecutionContext, blocking: AbstractSet[str] | None = None):
        self.context = context
        if blocking is None:
            blocking = {c.name for c in context.assets_def.check_specs if c.blocking}
        self.blocking = set(blocking)
        self.failed: list[str] = []

    def record(
        self,
        asset: str,
        date: str,
        metadata: Mapping[str, Any],
        checks: Sequence[AssetCheckResult] = (),
        why: str | None = None,
    ) -> Iterator[AssetMaterialization | AssetCheckEvaluation]:
        """Records the day; ``why`` says what a failed blocking check left published."""
        tags = self._provenance(asset, metadata)
        yield AssetMaterialization(asset, partition=date, metadata=metadata, tags=tags)
        # Stored by the time the generator resumes: the day's checks are evaluated against it.
        latest = latest_materialization(self.context, asset, date) if checks else None
        for result in checks:
            evaluation = _evaluation(asset, date, result, latest, self.blocking)
            if evaluation.blocking and not evaluation.passed and evaluation.severity == ERROR:
                note = f" ({why})" if why else ""
                self.failed.append(f"{asset} {date}: {evaluation.check_name}{note}")
            yield evaluation

    def _provenance(self, asset: str, metadata: Mapping[str, Any]) -> dict[str, str]:
        """What Dagster writes on the materialisations of an asset's own outputs, and a logged
        one lacks: each parent as the day was made from it (its data version and latest
        event), so the UI's "Unsynced" badge follows real changes (a promoted model, a day
        landed or scored again) and not every materialisation of a parent (the model asset,
        reused by every run). The day's own data version is its table commit where it has
        one, so the days downstream of a re-scored day read as unsynced."""
        key = AssetKey(asset)
        graph = self.context.job_def.asset_layer.asset_graph
        tags = {CODE_VERSION_TAG: graph.get(key).code_version or self.context.run_id}
        instance = self.context.instance
        for parent in sorted(graph.get(key).parent_keys):
            # The parent's latest event over all its partitions: any later one of the day's
            # partitions is after it, which is what Dagster compares against. Its latest
            # materialisation, else observation: in a run that does not materialise the parent
            # (a backfill of the scores alone) the job's graph shows it as external.
            record = instance.get_latest_data_version_record(parent, None)
            version = data_version_of(record.event_log_entry) if record is not None else None
            # A parent without a data version: the default Dagster records for one itself.
            tags[input_data_version_tag(parent)] = (version or DEFAULT_DATA_VERSION).value
            tags[input_event_pointer_tag(parent)] = (
                str(record.storage_id) if record is not None else NULL_EVENT_POINTER
            )
        commit = metadata.get("commit")
        if commit:
            tags[DATA_VERSION_TAG] = str(getattr(commit, "value", commit))
            tags[DATA_VERSION_IS_USER_PROVIDED_TAG] = "true"
        return tags

    def refused(self, checks: Sequence[AssetCheckResult]) -> list[str]:
        """The blocking checks among ``checks`` that failed with ERROR severity."""
        return [
            str(c.check_name)
            for c in checks
            if not c.passed and c.check_name in self.blocking and c.severity == ERROR
        ]

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
        # Each check's output, as Dagster yields one for an AssetCheckResult: the results went
        # out above as per-day evaluations, which Dagster does not count, so without these it
        # logs that the step "did not yield expected outputs" for every check that passed.
        for key in sorted(self.context.selected_asset_check_keys, key=str):
            yield Output(
                None,
                output_name=assets_def.get_output_name_for_asset_check_key(key),
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


def latest_materialization(context: AssetExecutionContext, asset: str, date: str):
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[date]), limit=1
    ).records
    return records[0] if records else None


def day_checks(context: AssetExecutionContext, asset: str, date: str) -> dict[str, bool]:
    """Whether each check on ``asset`` passed on ``date``, as :class:`DayRecorder` recorded
    them against the day's latest materialisation (a re-scored day's, not an earlier run's);
    empty when the day has none."""
    latest = latest_materialization(context, asset, date)
    if latest is None:
        return {}
    records = context.instance.get_records_for_run(
        latest.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION
    ).records
    results: dict[str, bool] = {}
    for record in records:
        evaluation = record.event_log_entry.dagster_event.event_specific_data
        target = evaluation.target_materialization_data
        if (
            evaluation.asset_key == AssetKey(asset)
            and evaluation.partition == date
            and target is not None
            and target.storage_id == latest.storage_id
        ):
            results[evaluation.check_name] = evaluation.passed
    return results


def _evaluation(
    asset: str, date: str, result: AssetCheckResult, latest, blocking: set[str]
) -> AssetCheckEvaluation:
    """A check result as the day's own evaluation, against the day's materialisation."""
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
