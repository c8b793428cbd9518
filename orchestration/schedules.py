"""Nightly schedules: each pipeline scores the day that just ended, at a staggered hour (UTC)."""

from __future__ import annotations

from dagster import DefaultScheduleStatus, ScheduleDefinition, build_schedule_from_partitioned_job

from assets.domains import PIPELINES
from assets.wiring import Pipeline
from orchestration.jobs import pipeline_jobs
from policy.tags import SCHEDULE_PRIORITY


def schedule_description(job_name: str, hour_utc: int) -> str:
    """What the schedule's page says a tick does. The page's "Partition set" row reads None for
    every schedule on this Dagster (it fills that row only for legacy partition sets, never for
    a partitioned asset job), so the partition a tick requests is said here."""
    return (
        f"Every day at {hour_utc:02d}:00 UTC, runs {job_name} for the previous UTC "
        "day: a tick on day D requests partition D-1, the day that just ended (the daily "
        "partitions are UTC days). The run key is that date, so each day is launched once; "
        "an earlier day is re-scored from a backfill."
    )


def nightly_schedule(pipeline: Pipeline, job) -> ScheduleDefinition:
    """``<job>_schedule``: each day at the pipeline's hour, runs ``job`` (built from
    ``pipeline``) for the day that just ended."""
    # RUNNING by default: a laptop running `make ui` really scores last night's partition, with
    # no click in the UI. Nightly runs go ahead of backfills waiting in the queue.
    return build_schedule_from_partitioned_job(
        job,
        name=f"{job.name}_schedule",
        description=schedule_description(job.name, pipeline.hour_utc),
        hour_of_day=pipeline.hour_utc,
        minute_of_hour=0,
        default_status=DefaultScheduleStatus.RUNNING,
        tags=SCHEDULE_PRIORITY,
    )


# Each domain picks its pipelines' hours (assets/<domain>/__init__.py), staggered so the GPU
# node serves one pipeline at a time.
schedules = [nightly_schedule(p, job) for p, job in zip(PIPELINES, pipeline_jobs, strict=True)]
