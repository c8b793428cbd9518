"""Nightly schedules: each pipeline scores the day that just ended, at a staggered hour (UTC)."""

from __future__ import annotations

from dagster import build_schedule_from_partitioned_job

from orchestration.jobs import pipeline_jobs

# Staggered so the GPU node serves one pipeline at a time: fraud first (alerts are urgent),
# recommendations next, summaries last (the morning digest is read after 07:00).
HOURS_UTC = {"fraud_scoring_job": 2, "recommendations_job": 3, "daily_summaries_job": 5}

schedules = [
    build_schedule_from_partitioned_job(
        job, name=f"{job.name}_schedule", hour_of_day=HOURS_UTC[job.name], minute_of_hour=0
    )
    for job in pipeline_jobs
]
