"""Re-score stale: the days a new champion made stale, shown per day in the UI and re-scored.

Two sensors over every scored asset whose model the registry holds (fraud_scores by
fraud_model, user_recommendations by recommendation_model):

- ``stale_days_sensor`` (on by default, cheap): when a model's champion changes, it records an
  observation on each day the new champion made stale (``stale``, ``scored_by``,
  ``stale_since_version``), which the asset's partition page and plots show per day;
- ``rescore_stale_sensor`` (off by default: turning it on is the re-score action, since it
  spends GPU hours): each tick, a run for each stale day of the last 30, newest first, at
  backfill priority, re-scoring the asset and what is downstream of it in its pipeline with the
  champion. A day already on the champion is never requested, nor one that a queued or
  running run is scoring; each (day, champion) pair is requested once (its run key), so a
  re-score that failed is rerun by hand, not in a loop.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

from dagster import (
    AssetKey,
    AssetObservation,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.domains import DOMAINS
from assets.shadow.asset import shadow_keys
from assets.staleness import (
    CHAMPION_CHOICE,
    StaleDay,
    champion,
    scored_days,
    stale_days,
    window,
)
from inference.models.modelstore import ModelNotFoundError
from orchestration.jobs import pipeline_jobs
from policy.partitions import daily_partitions
from policy.tags import (
    BACKFILL_PRIORITY,
    MODEL_CHOICE_TAG,
    PARTITION_RANGE_END_TAG,
    PARTITION_RANGE_START_TAG,
    PARTITION_TAG,
    STALE_VERSION_TAG,
    TRIGGER_TAG,
)
from resources.storage import DataStore, StorageResource

RESCORE_WINDOW_DAYS = 30
IN_PROGRESS = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
]


@dataclass(frozen=True)
class Target:
    """A scored asset whose days a model's champion can make stale.

    Attributes:
        asset: the scored asset (its days record ``model_version``).
        model: the model's name in the store (its asset key).
        job: the pipeline job that scores it.
        selection: what a re-score materialises: the asset and what its pipeline derives from
            it (alerts from scores), never the landing or the model.
    """

    asset: str
    model: str
    job: str
    selection: tuple[str, ...]


def _targets() -> tuple[Target, ...]:
    targets = []
    for domain in DOMAINS:
        for pipeline in domain.pipelines:
            models = [t.model for t in domain.training if t.model in pipeline.assets]
            # A shadow is the challenger's evidence for its promotion, not a day's output.
            below = _downstream(domain, AssetKey(pipeline.scored)) - shadow_keys(domain.defs.assets)
            selection = tuple(a for a in pipeline.assets if AssetKey(a) in below)
            targets += [Target(pipeline.scored, m, pipeline.job, selection) for m in models]
    return tuple(targets)


def _downstream(domain, key: AssetKey) -> set[AssetKey]:
    """``key`` and every asset of the domain that depends on it, directly or not."""
    deps = {
        k: set(assets_def.asset_deps[k])
        for assets_def in domain.defs.assets
        for k in assets_def.keys
    }
    found = {key}
    while grown := {k for k, up in deps.items() if up & found and k not in found}:
        found |= grown
    return found


TARGETS: tuple[Target, ...] = _targets()
TARGETS_BY_ASSET: dict[str, Target] = {t.asset: t for t in TARGETS}


def stale_in(
    instance: DagsterInstance, store: DataStore, target: Target, dates: list[str] | None
) -> list[StaleDay]:
    """The target's stale days among ``dates`` (None: every day), newest first; none when its
    model has no champion yet."""
    try:
        current = champion(store, target.model)
    except ModelNotFoundError:
        return []
    return stale_days(scored_days(instance, target.asset, dates), current)


def rescore_requests(stale: list[StaleDay], target: Target) -> list[RunRequest]:
    """One run per stale day, in the order given (newest first), re-scoring with the champion."""
    return [
        RunRequest(
            job_name=target.job,
            partition_key=day.date,
            asset_selection=[AssetKey(a) for a in target.selection],
            run_key=f"rescore:{target.asset}:{day.date}:{day.champion}",
            tags={
                TRIGGER_TAG: "rescore_stale_sensor",
                MODEL_CHOICE_TAG: CHAMPION_CHOICE,
                STALE_VERSION_TAG: day.scored_by or "unrecorded",
                **BACKFILL_PRIORITY,
            },
        )
        for day in stale
    ]


def days_in_flight(instance: DagsterInstance, target: Target) -> set[str]:
    """The days of the target's asset that a queued or running run is scoring (a backfill, the
    nightly run, an earlier re-score): a re-score now would score them twice."""
    days: set[str] = set()
    for run in instance.get_runs(RunsFilter(statuses=IN_PROGRESS)):
        selected = run.asset_selection
        if selected is None and run.job_name != target.job:
            continue
        if selected is not None and AssetKey(target.asset) not in selected:
            continue
        tags = run.tags
        if PARTITION_TAG in tags:
            days.add(tags[PARTITION_TAG])
        elif PARTITION_RANGE_START_TAG in tags and PARTITION_RANGE_END_TAG in tags:
            start = dt.date.fromisoformat(tags[PARTITION_RANGE_START_TAG])
            end = tags[PARTITION_RANGE_END_TAG]
            days.update(window(end, (dt.date.fromisoformat(end) - start).days + 1))
    return days


def last_window(days: int = RESCORE_WINDOW_DAYS) -> list[str]:
    """The last ``days`` daily partitions, ending with the last completed day."""
    last = daily_partitions.get_last_partition_key()
    return window(last, days) if last else []


@sensor(
    name="rescore_stale_sensor",
    jobs=pipeline_jobs,
    minimum_interval_seconds=300,
    default_status=DefaultSensorStatus.STOPPED,
    description=f"Off by default (it spends GPU hours): turning it on re-scores the stale days. "
    f"Each tick requests, for every scored asset whose model has a champion, a run for each "
    f"day of the last {RESCORE_WINDOW_DAYS} scored by another version, newest first, at "
    "backfill priority; a day already on the champion is never requested, and each day is "
    "requested once per champion.",
)
def rescore_stale_sensor(
    context: SensorEvaluationContext, storage: StorageResource
) -> SensorResult:
    store, dates = storage.store(), last_window()
    requests: list[RunRequest] = []
    for target in TARGETS:
        busy = days_in_flight(context.instance, target)
        stale = [d for d in stale_in(context.instance, store, target, dates) if d.date not in busy]
        requests += rescore_requests(stale, target)
    if not requests:
        return SensorResult(skip_reason=SkipReason(f"no stale day in {dates[0]}..{dates[-1]}"))
    return SensorResult(run_requests=requests)


@sensor(
    name="stale_days_sensor",
    minimum_interval_seconds=300,
    default_status=DefaultSensorStatus.RUNNING,
    description="When a model's champion changes, records an observation on each day of its "
    "scored asset that the new champion made stale (stale = 1, scored_by, "
    "stale_since_version): the asset's partitions show them per day. Re-score them with "
    "rescore_stale_sensor, or list them with `nightshift stale`.",
)
def stale_days_sensor(context: SensorEvaluationContext, storage: StorageResource) -> SensorResult:
    store = storage.store()
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    events: list[AssetObservation] = []
    for target in TARGETS:
        try:
            current = champion(store, target.model)
        except ModelNotFoundError:
            continue
        if seen.get(target.asset) == current:
            continue
        seen[target.asset] = current
        stale = stale_days(scored_days(context.instance, target.asset), current)
        events += [stale_observation(target.asset, day) for day in stale]
    cursor = json.dumps(seen, sort_keys=True)
    if not events:
        return SensorResult(skip_reason=SkipReason("no champion changed"), cursor=cursor)
    return SensorResult(asset_events=events, cursor=cursor)


def stale_observation(asset: str, day: StaleDay) -> AssetObservation:
    """The day's mark in the UI: ``stale`` is plotted over the partitions."""
    return AssetObservation(
        asset_key=asset,
        partition=day.date,
        description=f"scored by {day.scored_by}; the champion is now {day.champion}",
        metadata={
            "stale": 1,
            "scored_by": day.scored_by or "unrecorded",
            "stale_since_version": day.champion,
        },
    )


sensors = [rescore_stale_sensor, stale_days_sensor]
