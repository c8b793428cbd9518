"""The landing sensor: a landing partition that no run has read yet launches each job reading it."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.domains import PIPELINES
from assets.landing import LANDING_FINGERPRINT
from assets.wiring import Pipeline
from orchestration.jobs import landing_triggers, pipeline_jobs
from policy.partitions import daily_partitions
from policy.settings import positive_int_setting
from policy.tags import DATASET_TAG, LANDING_FINGERPRINT_TAG, SENSOR_PRIORITY, TRIGGER_TAG
from resources.storage import StorageResource

# Observations of a landing partition: one per read (a few per run) and the failure sensor's
# one per failed run; a read of the current files is among the latest few.
_OBSERVATIONS_TO_SEARCH = 20

LANDING_SENSOR_INTERVAL_ENV = "NIGHTSHIFT_LANDING_SENSOR_INTERVAL_S"
DEFAULT_LANDING_SENSOR_INTERVAL_S = 60


def landing_sensor_interval_from(seconds: str | None) -> int:
    """The least time between two evaluations of the landing sensor.

    Args:
        seconds: unset or empty for the default; a positive integer for a deployment whose
            landings must start sooner (each evaluation lists every landing folder).
    """
    n = positive_int_setting(
        LANDING_SENSOR_INTERVAL_ENV,
        seconds,
        "seconds between landing sensor evaluations",
        str(DEFAULT_LANDING_SENSOR_INTERVAL_S),
    )
    return DEFAULT_LANDING_SENSOR_INTERVAL_S if n is None else n


def build_landing_sensor(pipelines: Sequence[Pipeline], jobs: Sequence[Any]) -> SensorDefinition:
    """``landing_sensor`` over ``pipelines`` and their asset ``jobs``: every shipped domain's in
    the code location, or one pipeline's own (``nightshift.nightly``)."""
    triggers = landing_triggers(pipelines)
    # The asset whose materialisation means "the job scored that day", per triggered job, and
    # per job the assets no other pipeline job materialises.
    scoring = {p.job: p.scored for p in pipelines}
    own = {
        p.job: set(p.assets).difference(*(o.assets for o in pipelines if o.job != p.job))
        for p in pipelines
    }
    read_by = "; ".join(f"{d}: {', '.join(j)}" for d, j in triggers.items())

    @sensor(
        name="landing_sensor",
        jobs=list(jobs),
        # Read when the code location loads, like the other operator settings.
        minimum_interval_seconds=landing_sensor_interval_from(
            os.environ.get(LANDING_SENSOR_INTERVAL_ENV)
        ),
        description="Off by default: the nightly schedules score each day that ended, so this "
        "is for landings that arrive late or are re-delivered. When on, it launches each "
        f"pipeline that reads a landing partition ({read_by}) only if no run of that pipeline "
        "has read its files as they are now: a day already scored, or one whose last run "
        "failed (bad input, a bug), is not relaunched until a landing file is added, replaced "
        "or removed. Re-run such a day from its run page or a backfill. A date in its cursor "
        "counts as handled.",
    )
    def landing_sensor(context: SensorEvaluationContext, storage: StorageResource) -> SensorResult:
        store = storage.store()
        # "Changed" is a fingerprint of the files (path, size, mtime), not file times against
        # the materialisation's timestamp: it also sees a file removed, or replaced by one with
        # an older mtime (cp -p, rsync -t), and needs no agreement between the store's and
        # Dagster's clocks. Every step that reads landing records the fingerprint it read
        # (assets/landing.py record_landing_read), before reading, so a failed run counts as
        # having read the files. The cursor remembers, per dataset and date, the fingerprint
        # of the files a run was asked for or found to have read, so each evaluation only asks
        # the instance about changed days. The run key carries the job and the fingerprint: a
        # lost cursor cannot launch the same files twice for one job, and changed files get a
        # run of their own.
        handled = _load_cursor(context.cursor)
        valid = set(daily_partitions.get_partition_keys())
        requests: list[RunRequest] = []
        for dataset, job_names in triggers.items():
            seen = handled.setdefault(dataset, {})
            # A folder for today is not a partition yet (the day is not over); later it is.
            for date in (d for d in store.landing_dates(dataset) if d in valid):
                fingerprint = store.landing_fingerprint(dataset, date)
                if fingerprint is None or seen.get(date) in (fingerprint, ""):
                    if fingerprint is not None:
                        seen[date] = fingerprint
                    continue
                seen[date] = fingerprint
                requests.extend(
                    _run_request(job_name, dataset, date, fingerprint)
                    for job_name in job_names
                    if not _already_read(
                        context.instance, own[job_name], scoring[job_name], dataset, date,
                        fingerprint,
                    )
                )  # fmt: skip
        cursor = json.dumps(handled, sort_keys=True)
        if not requests:
            return SensorResult(
                skip_reason=SkipReason("no landing partition with files that no run has read"),
                cursor=cursor,
            )
        return SensorResult(run_requests=requests, cursor=cursor)

    return landing_sensor


landing_sensor = build_landing_sensor(PIPELINES, pipeline_jobs)


def _run_request(job_name: str, dataset: str, date: str, fingerprint: str) -> RunRequest:
    """The run of ``job_name`` for one landing partition's files as they are now."""
    return RunRequest(
        job_name=job_name,
        partition_key=date,
        run_key=f"{job_name}:{dataset}:{date}:{fingerprint}",
        tags={
            TRIGGER_TAG: "landing_sensor",
            DATASET_TAG: dataset,
            LANDING_FINGERPRINT_TAG: fingerprint,
            **SENSOR_PRIORITY,
        },
    )


def _load_cursor(cursor: str | None) -> dict[str, dict[str, str]]:
    """Per dataset, date -> fingerprint handled. A plain list of dates (what an operator types
    into "Set cursor") means those dates are handled with the files they have now."""
    raw = json.loads(cursor) if cursor else {}
    return {
        dataset: dict(dates) if isinstance(dates, dict) else dict.fromkeys(dates, "")
        for dataset, dates in raw.items()
    }


def _already_read(
    instance: DagsterInstance,
    job_assets: set[str],
    scoring_asset: str,
    dataset: str,
    date: str,
    fingerprint: str,
) -> bool:
    """Whether a run of ``job_name`` already read these landing files (it scored them, failed
    on them, or is reading them), or the day was scored before reads were recorded. Only reads
    by the job's own assets count: `documents` is read by the summaries and the embeddings, and
    one having seen these files says nothing of whether the other did."""
    observations = instance.fetch_observations(
        AssetRecordsFilter(asset_key=AssetKey(dataset), asset_partitions=[date]),
        limit=_OBSERVATIONS_TO_SEARCH,
    ).records
    read = [
        meta[LANDING_FINGERPRINT].value
        for o in observations
        if o.asset_observation
        and LANDING_FINGERPRINT in (meta := o.asset_observation.metadata)
        and meta["read_by"].value in job_assets
    ]
    if read:
        return read[0] == fingerprint
    scored = instance.get_materialized_partitions(AssetKey(scoring_asset))
    return date in scored
