"""The publish steps' jobs: each serves one pipeline's scored day (assets/serving/), run after
that pipeline's job by ``nightshift run`` and, once the day's blocking checks passed, by the
automation sensor (orchestration/automation.py).

Jobs of their own rather than steps of the pipeline jobs: the serving store is another system,
and a store that is down fails its publish run, naming it, while the scored day stays
published and its job succeeded.
"""

from __future__ import annotations

from dagster import AssetSelection, define_asset_job

from assets.serving import PUBLISH_JOBS
from policy.partitions import daily_partitions
from policy.retries import ERROR_RETRY_POLICY

publish_jobs = [
    define_asset_job(
        publish.job,
        selection=AssetSelection.assets(publish.asset),
        partitions_def=daily_partitions,
        op_retry_policy=ERROR_RETRY_POLICY,
        description=f"Serves the day {publish.after} published: {publish.asset}.",
    )
    for publish in PUBLISH_JOBS
]


def publish_jobs_after(job: str) -> list[str]:
    """The publish jobs that follow the pipeline job ``job``."""
    return [p.job for p in PUBLISH_JOBS if p.after == job]
