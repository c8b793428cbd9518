"""The output tables' upkeep as a scheduled job: every table's old snapshots expired and its
orphan files deleted past the retention (inference/engine/table_upkeep.py)."""

import datetime as dt

from dagster import DefaultScheduleStatus, OpExecutionContext, ScheduleDefinition, job, op

from orchestration.outputs_cli import RETENTION_ENV, retention_days, table_names
from resources.storage import StorageResource


@op
def expire_output_snapshots(context: OpExecutionContext, storage: StorageResource) -> list[dict]:
    """Expires each output table's snapshots older than the retention (each day's head on main
    is kept), removes audit and rejected branches cut before it, and deletes files no snapshot
    references that are older than it."""
    from inference.engine.table_upkeep import upkeep

    store = storage.store()
    days = retention_days()
    now = dt.datetime.now(dt.UTC)
    done_all = []
    for name in table_names(store):
        done = upkeep(store.tables, name, dt.timedelta(days=days), now, store.fs)
        (context.log.warning if done.refused else context.log.info)(
            f"{done.describe(days)} (${RETENTION_ENV})"
        )
        done_all.append({**done.__dict__, "retention_days": days})
    return done_all


@job(description="Expires the output tables' old snapshots and deletes their orphan files.")
def outputs_upkeep_job() -> None:
    expire_output_snapshots()


# After the nightly pipelines (the last at 06:00 UTC), so upkeep never races a night's commit.
outputs_upkeep_job_schedule = ScheduleDefinition(
    job=outputs_upkeep_job,
    cron_schedule="0 9 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Every day at 09:00 UTC: the output tables' upkeep (retention "
    f"${RETENTION_ENV}, default 30 days).",
)
