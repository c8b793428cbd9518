"""The sensors that act on the automation policy (policy/automation.py): the one that runs
downstream assets by themselves, and the one that reports failed partitions with the reason
they failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dagster import (
    AssetCheckSeverity,
    AssetKey,
    AssetObservation,
    AssetSelection,
    AutomationConditionSensorDefinition,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DefaultSensorStatus,
    Failure,
    MetadataValue,
    PartitionKeyRange,
    RunFailureSensorContext,
    run_failure_sensor,
)

from policy.partitions import daily_partitions
from policy.tags import (
    INTERRUPTED_TAG,
    INTERRUPTIONS_TAG,
    PARENT_RUN_TAG,
    PARTITION_RANGE_END_TAG,
    PARTITION_RANGE_START_TAG,
    PARTITION_TAG,
)

# Declared so that it runs without a click: Dagster's implicit one starts STOPPED.
automation_condition_sensor = AutomationConditionSensorDefinition(
    "automation_condition_sensor",
    target=AssetSelection.all(),
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    description="Materialises fraud_alerts, daily_digest and the publish steps that serve a "
    "day once their parent partition is materialised and its blocking checks passed.",
)

# --- Reporting failed runs --------------------------------------------------------------------

CHECK_FAILED_ERROR = "DagsterAssetCheckFailedError"

INTERRUPTED, CHECK_FAILED, ERROR = "interrupted", "check failed", "error"


@dataclass(frozen=True)
class FailureReport:
    """Why one run failed and which partitions it leaves unscored."""

    run_id: str
    job_name: str
    reason: str
    partitions: list[str]
    assets: dict[str, bool]  # failed or skipped asset -> whether it is partitioned
    detail: str

    @property
    def message(self) -> str:
        where = _describe_partitions(self.partitions) or "no partition"
        targets = ", ".join(self.assets) or self.job_name
        return f"{targets} {where} failed ({self.reason}) in run {self.run_id}: {self.detail}"


def run_partitions(run: DagsterRun) -> list[str]:
    """The partition keys a run covers: one, a range (single-run backfill), or none."""
    tags = run.tags
    if PARTITION_TAG in tags:
        return [tags[PARTITION_TAG]]
    start = tags.get(PARTITION_RANGE_START_TAG)
    end = tags.get(PARTITION_RANGE_END_TAG)
    if start and end:
        return list(daily_partitions.get_partition_keys_in_range(PartitionKeyRange(start, end)))
    return []


def classify_failure(
    instance: DagsterInstance,
    run: DagsterRun,
    is_partitioned: Callable[[AssetKey], bool] | None = None,
) -> FailureReport:
    """Tells an interruption (retry resumes) from a failed blocking check (the data is wrong)
    from any other error (the code or the input is wrong), from the run's tags and events.

    Args:
        is_partitioned: from the asset graph; without it an asset counts as partitioned when
            the run planned it for a partition (true of every asset in a partitioned run).
    """
    step_failures = _events(instance, run.run_id, DagsterEventType.STEP_FAILURE)
    failed_checks = sorted(
        {
            f"{e.asset_key.to_user_string()}.{e.check_name}"
            for e in _check_evaluations(instance, run.run_id)
            if not e.passed and e.blocking and e.severity == AssetCheckSeverity.ERROR
        }
    )
    chains = [_chain(f.step_failure_data.error) for f in step_failures if f.step_failure_data.error]
    errors = [error for chain in chains for error in chain]
    failed_steps = sorted({f.step_key for f in step_failures if f.step_key})
    if _interrupted_in_this_run(instance, run):
        count = run.tags.get(INTERRUPTIONS_TAG, "1")
        reason, detail = INTERRUPTED, f"{count} interruption(s); a retry resumes from its shards"
    elif failed_checks or any(e.cls_name == CHECK_FAILED_ERROR for e in errors):
        reason, detail = (
            CHECK_FAILED,
            "blocking checks failed: " + (", ".join(failed_checks) or "?"),
        )
    else:
        reason = ERROR
        detail = _actionable(chains[0]) if chains else "the run failed"
    return FailureReport(
        run_id=run.run_id,
        job_name=run.job_name,
        reason=reason,
        partitions=run_partitions(run),
        assets=_unfinished_assets(instance, run.run_id, failed_steps, is_partitioned),
        detail=detail[:500],
    )


def _unfinished_assets(
    instance: DagsterInstance,
    run_id: str,
    failed_steps: list[str],
    is_partitioned: Callable[[AssetKey], bool] | None,
) -> dict[str, bool]:
    """Assets the run planned and whose step failed or that it never materialised (skipped),
    each with whether it was planned for partitions."""
    planned = _events(instance, run_id, DagsterEventType.ASSET_MATERIALIZATION_PLANNED)
    done = _events(instance, run_id, DagsterEventType.ASSET_MATERIALIZATION)
    materialised = {e.asset_key for e in done}
    unfinished: dict[str, bool] = {}
    for event in planned:
        if event.step_key in failed_steps or event.asset_key not in materialised:
            data = event.event_specific_data
            partitioned = (
                is_partitioned(event.asset_key)
                if is_partitioned
                else bool(data.partition or data.partitions_subset)
            )
            name = event.asset_key.to_user_string()
            unfinished[name] = unfinished.get(name, False) or partitioned
    return dict(sorted(unfinished.items()))


def _actionable(chain: list) -> str:
    """What the operator needs from a failed step's errors: the description of the innermost
    ``Failure`` the code raised (it says what to do, e.g. "train the model once: ..."), else
    the root cause (the user's exception, not Dagster's wrapper around it): "ValueError: ...".
    """
    failures = [e for e in chain if e.cls_name == "Failure"]
    if failures:
        return failures[-1].message.strip().removeprefix(f"{Failure.__module__}.")
    return chain[-1].message.strip()


def _events(instance: DagsterInstance, run_id: str, event_type: DagsterEventType) -> list:
    records = instance.get_records_for_run(run_id, of_type=event_type).records
    return [r.event_log_entry.dagster_event for r in records]


def _chain(error) -> list:
    """An error and the errors that caused it, outermost first."""
    chain = [error]
    while chain[-1].cause is not None and len(chain) < 10:
        chain.append(chain[-1].cause)
    return chain


def _check_evaluations(instance: DagsterInstance, run_id: str) -> list:
    events = _events(instance, run_id, DagsterEventType.ASSET_CHECK_EVALUATION)
    return [e.event_specific_data for e in events]


def _interrupted_in_this_run(instance: DagsterInstance, run: DagsterRun) -> bool:
    """True when this run (not only an earlier attempt) was interrupted.

    A retry copies its parent's tags, so the flag alone may be inherited: the interruption
    count must have grown since the parent run.
    """
    if run.tags.get(INTERRUPTED_TAG) != "true":
        return False
    parent_id = run.tags.get(PARENT_RUN_TAG)
    parent = instance.get_run_by_id(parent_id) if parent_id else None
    if parent is None or parent.tags.get(INTERRUPTED_TAG) != "true":
        return True
    return _count(run.tags.get(INTERRUPTIONS_TAG)) > _count(parent.tags.get(INTERRUPTIONS_TAG))


def _count(value: str | None) -> int:
    return int(value) if value and value.isdigit() else 0


def _describe_partitions(partitions: Sequence[str]) -> str:
    if len(partitions) > 1:
        return f"{partitions[0]}...{partitions[-1]} ({len(partitions)} partitions)"
    return partitions[0] if partitions else ""


def failure_observations(report: FailureReport) -> list[AssetObservation]:
    """One observation per failed asset partition, so the asset's page shows why it is missing."""
    metadata = {
        "failure_reason": report.reason,
        "failure_detail": report.detail,
        "failed_run": MetadataValue.dagster_run(report.run_id),
    }
    return [
        AssetObservation(asset_key=AssetKey.from_user_string(asset), partition=p, metadata=metadata)
        for asset, partitioned in report.assets.items()
        for p in (report.partitions if partitioned and report.partitions else [None])
    ]


@run_failure_sensor(
    name="run_failure_sensor",
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    description="Reports each failed run's partitions with the reason: interrupted (a retry "
    "resumes), check failed (the output is wrong) or error.",
)
def run_failure_sensor(context: RunFailureSensorContext) -> None:
    graph = context.repository_def.asset_graph if context.repository_def else None
    report = classify_failure(
        context.instance,
        context.dagster_run,
        (lambda key: graph.has(key) and graph.get(key).is_partitioned) if graph else None,
    )
    context.log.error(report.message)
    for observation in failure_observations(report):
        context.instance.report_runless_asset_event(observation)
