"""Nightly schedules: each pipeline scores the day that just ended, at a staggered hour (UTC)."""

from __future__ import annotations

from dagster import DefaultScheduleStatus, build_schedule_from_partitioned_job

from orchestration.jobs import pipeline_jobs
from policy.tags import SCHEDULE_PRIORITY

# Staggered so the GPU node serves one pipeline at a time: fraud first (alerts are urgent),
# recommendations next, then summaries (the morning digest is read after 07:00), embeddings last
# (documents land by 05:00; one encoder pass a document fits the hour before the 07:00 deadline).
HOURS_UTC = {
    "fraud_scoring_job": 2,
    "recommendations_job": 3,
    "daily_summaries_job": 5,
    "document_embeddings_job": 6,
}


def schedule_description(job_name: str) -> str:
    """What the schedule's page says a tick does. The page's "Partition set" row reads None for
    every schedule on this Dagster (it fills that row only for legacy partition sets, never for
    a partitioned asset job), so the partition a tick requests is said here."""
    return (
        f"Every day at {HOURS_UTC[job_name]:02d}:00 UTC, runs {job_name} for the previous UTC "
        "day: a tick on day D requests partition D-1, the day that just ended (the daily "
        "partitions are UTC days). The run key is that date, so each day is launched once; "
        "an earlier day is re-scored from a backfill."
    )


# RUNNING by default: a laptop running `make ui` really scores last night's partition, with no
# click in the UI. Nightly runs go ahead of backfills waiting in the queue.
schedules = [
    build_schedule_from_partitioned_job(
        job,
        name=f"{job.name}_schedule",
        description=schedule_description(job.name),
        hour_of_day=HOURS_UTC[job.name],
        minute_of_hour=0,
        default_status=DefaultScheduleStatus.RUNNING,
        tags=SCHEDULE_PRIORITY,
    )
    for job in pipeline_jobs
]
