"""The landing sensor: a new landing partition launches the job that scores it."""

from __future__ import annotations

import json

from dagster import RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from orchestration.automation import SENSOR_PRIORITY
from orchestration.jobs import LANDING_TRIGGERS, pipeline_jobs
from orchestration.partitions import daily_partitions
from resources.storage import StorageResource

JOBS = {job.name: job for job in pipeline_jobs}


@sensor(
    name="landing_sensor",
    jobs=list(JOBS.values()),
    minimum_interval_seconds=60,
    description="Launches the pipeline for every landing partition that appears "
    "(transactions, interactions, documents), once per dataset and date.",
)
def landing_sensor(context: SensorEvaluationContext, storage: StorageResource) -> SensorResult:
    store = storage.store()
    # The cursor remembers the dates already requested per dataset, so each evaluation only
    # lists new folders; the run key makes a repeat request a no-op even if the cursor is lost.
    seen: dict[str, list[str]] = json.loads(context.cursor) if context.cursor else {}
    valid = set(daily_partitions.get_partition_keys())
    requests: list[RunRequest] = []
    for dataset, job_name in LANDING_TRIGGERS.items():
        already = set(seen.get(dataset, []))
        # A folder for today is not a partition yet (the day is not over); it is picked up later.
        new = [d for d in store.landing_dates(dataset) if d not in already and d in valid]
        for date in new:
            requests.append(
                RunRequest(
                    job_name=job_name,
                    partition_key=date,
                    run_key=f"{dataset}:{date}",
                    tags={
                        "nightshift/trigger": "landing_sensor",
                        "nightshift/dataset": dataset,
                        **SENSOR_PRIORITY,
                    },
                )
            )
        seen[dataset] = sorted(already | set(new))
    cursor = json.dumps(seen, sort_keys=True)
    if not requests:
        return SensorResult(skip_reason=SkipReason("no new landing partitions"), cursor=cursor)
    return SensorResult(run_requests=requests, cursor=cursor)
