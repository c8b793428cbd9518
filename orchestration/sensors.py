"""The landing sensor: a landing partition that no run has read yet launches the job scoring it."""

from __future__ import annotations

import json

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.common import LANDING_FINGERPRINT
from orchestration.jobs import LANDING_TRIGGERS, PIPELINES, pipeline_jobs
from policy.partitions import daily_partitions
from policy.tags import DATASET_TAG, LANDING_FINGERPRINT_TAG, SENSOR_PRIORITY, TRIGGER_TAG
from resources.storage import StorageResource

JOBS = {job.name: job for job in pipeline_jobs}

# The asset whose materialisation means "the pipeline scored that day", per landing dataset.
SCORING_ASSETS: dict[str, str] = {
    "transactions": "fraud_scores",
    "interactions": "user_recommendations",
    "documents": "document_summaries",
}
assert all(SCORING_ASSETS[d] in PIPELINES[j] for d, j in LANDING_TRIGGERS.items())

# Observations of a landing partition: one per read (a few per run) and the failure sensor's
# one per failed run; a read of the current files is among the latest few.
_OBSERVATIONS_TO_SEARCH = 20


@sensor(
    name="landing_sensor",
    jobs=list(JOBS.values()),
    minimum_interval_seconds=60,
    description="Off by default: the nightly schedules score each day that ended, so this is "
    "for landings that arrive late or are re-delivered. When on, it launches the pipeline for "
    "a landing partition (transactions, interactions, documents) only if no run has read its "
    "files as they are now: a day already scored, or one whose last run failed (bad input, a "
    "bug), is not relaunched until a landing file is added, replaced or removed. Re-run "
    "such a day from its run page or a backfill. A date in its cursor counts as handled.",
)
def landing_sensor(context: SensorEvaluationContext, storage: StorageResource) -> SensorResult:
    store = storage.store()
    # "Changed" is a fingerprint of the files (path, size, mtime), not file times against the
    # materialisation's timestamp: it also sees a file removed, or replaced by one with an
    # older mtime (cp -p, rsync -t), and needs no agreement between the store's and Dagster's
    # clocks. Every step that reads landing records the fingerprint it read (assets/common.py
    # record_landing_read), before reading, so a failed run counts as having read the files.
    # The cursor remembers, per dataset and date, the fingerprint of the files a run was asked
    # for or found to have read, so each evaluation only asks the instance about changed days.
    # The run key carries the fingerprint: a lost cursor cannot launch the same files twice,
    # and changed files get a run of their own.
    handled = _load_cursor(context.cursor)
    valid = set(daily_partitions.get_partition_keys())
    requests: list[RunRequest] = []
    for dataset, job_name in LANDING_TRIGGERS.items():
        seen = handled.setdefault(dataset, {})
        # A folder for today is not a partition yet (the day is not over); it is picked up later.
        for date in (d for d in store.landing_dates(dataset) if d in valid):
            fingerprint = store.landing_fingerprint(dataset, date)
            if fingerprint is None or seen.get(date) in (fingerprint, ""):
                if fingerprint is not None:
                    seen[date] = fingerprint
                continue
            seen[date] = fingerprint
            if _already_read(context.instance, dataset, date, fingerprint):
                continue
            requests.append(
                RunRequest(
                    job_name=job_name,
                    partition_key=date,
                    run_key=f"{dataset}:{date}:{fingerprint}",
                    tags={
                        TRIGGER_TAG: "landing_sensor",
                        DATASET_TAG: dataset,
                        LANDING_FINGERPRINT_TAG: fingerprint,
                        **SENSOR_PRIORITY,
                    },
                )
            )
    cursor = json.dumps(handled, sort_keys=True)
    if not requests:
        return SensorResult(
            skip_reason=SkipReason("no landing partition with files that no run has read"),
            cursor=cursor,
        )
    return SensorResult(run_requests=requests, cursor=cursor)


def _load_cursor(cursor: str | None) -> dict[str, dict[str, str]]:
    """Per dataset, date -> fingerprint handled. A plain list of dates (what an operator types
    into "Set cursor") means those dates are handled with the files they have now."""
    raw = json.loads(cursor) if cursor else {}
    return {
        dataset: dict(dates) if isinstance(dates, dict) else dict.fromkeys(dates, "")
        for dataset, dates in raw.items()
    }


# Per pipeline job, the assets no other pipeline job materialises.
_OWN_ASSETS: dict[str, set[str]] = {
    job: set(keys).difference(*(other for name, other in PIPELINES.items() if name != job))
    for job, keys in PIPELINES.items()
}


def _already_read(instance: DagsterInstance, dataset: str, date: str, fingerprint: str) -> bool:
    """Whether a run of the job this dataset triggers already read these landing files (it
    scored them, failed on them, or is reading them), or the day was scored before reads were
    recorded. Only reads by the triggered job's own assets count: `documents` is read by the
    embeddings job too, which says nothing of whether the summaries saw these files."""
    observations = instance.fetch_observations(
        AssetRecordsFilter(asset_key=AssetKey(dataset), asset_partitions=[date]),
        limit=_OBSERVATIONS_TO_SEARCH,
    ).records
    job_assets = _OWN_ASSETS[LANDING_TRIGGERS[dataset]]
    read = [
        meta[LANDING_FINGERPRINT].value
        for o in observations
        if o.asset_observation
        and LANDING_FINGERPRINT in (meta := o.asset_observation.metadata)
        and meta["read_by"].value in job_assets
    ]
    if read:
        return read[0] == fingerprint
    scored = instance.get_materialized_partitions(AssetKey(SCORING_ASSETS[dataset]))
    return date in scored
