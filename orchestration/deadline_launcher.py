"""EcsRunLauncher that asks the deadline-aware policy at a partition's first launch.

A retry carries the capacity its interrupted run chose (assets/checkpointing.py), but a first
launch goes where the instance's ``run_task_kwargs`` say: spot. A day that cannot make its
ready-by even on on-demand should not start on spot and find out at 06:40. So before a run's
first launch this launcher reads the scored assets' recent days from their cost ledgers (rows
a day, rows per second, launch-to-first-shard), asks ``policy.deadline.choose_capacity`` via
``assets.deadline_capacity`` (the same path as a retry), tags the run with the capacity and the
reason, and says why in the run's event log. deploy/aws/dagster.yaml names it.

A day whose ready-by has passed (a backfill), an asset without a committed day yet, or a run of
no partition launches as before.
"""

from __future__ import annotations

import time

from dagster import DagsterRun
from dagster_aws.ecs import EcsRunLauncher

from assets.dagster_private import LaunchRunContext
from inference.engine.ledger import LedgerBook, recent_rate
from policy.capacity import tags_for_capacity
from policy.deadline import IDLE, CapacityDecision
from policy.ready_by import NightFacts, deadline_decision, ready_by
from policy.tags import CAPACITY_REASON_TAG, PARENT_RUN_TAG, PARTITION_TAG
from resources.storage import store_from_env


class DeadlineEcsRunLauncher(EcsRunLauncher):
    """``EcsRunLauncher`` with the capacity of a partition's first launch chosen by deadline."""

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        try:
            tags = self._first_launch_tags(run)
        except Exception as exc:  # noqa: BLE001 - an estimate must never stop a launch
            self._instance.report_engine_event(
                f"at launch: deadline-aware capacity skipped ({exc!r}); launching as configured",
                run,
            )
            tags = {}
        if tags:
            self._instance.add_run_tags(run.run_id, tags)
            run = self._instance.get_run_by_id(run.run_id)
            context = LaunchRunContext(dagster_run=run, workspace=context.workspace)
        super().launch_run(context)

    def _first_launch_tags(self, run: DagsterRun) -> dict[str, str]:
        date = run.tags.get(PARTITION_TAG)
        if date is None or PARENT_RUN_TAG in run.tags:
            return {}
        decisions = [d for d in map(self._decide(run, date), self._assets(run)) if d is not None]
        if not decisions:
            return {}
        # The asset with the least slack sets the run's capacity: the run scores them all.
        decision = min(decisions, key=lambda d: d.time_left_s - d.work_left_s)
        self._instance.report_engine_event(f"at launch: {decision.reason}", run)
        tags = {CAPACITY_REASON_TAG: decision.reason}
        if decision.on_demand:
            tags.update(tags_for_capacity(decision.capacity, current_tags=run.tags))
        return tags

    def _assets(self, run: DagsterRun) -> list[str]:
        """The run's steps that are scored assets: those with a cost ledger."""
        snapshot = self._instance.get_job_snapshot(run.job_snapshot_id)
        return [op.name for op in snapshot.node_defs_snapshot.op_def_snaps]

    def _decide(self, run: DagsterRun, date: str):
        store = store_from_env()

        def decide(asset: str) -> CapacityDecision | None:
            book = LedgerBook(store.partition_target(asset, date), asset, date)
            recent = book.recent()
            totals = [x.rows_total for x in recent if x.rows_total]
            rate = recent_rate(recent)
            if not totals or rate is None:
                return None
            overheads = [o for x in recent if (o := x.restart_overhead_s())]
            now = time.time()
            facts = NightFacts(
                rows_left=round(sum(totals) / len(totals)),
                rows_total=round(sum(totals) / len(totals)),
                rows_per_second=rate,
                restart_overhead_s=sum(overheads) / len(overheads) if overheads else None,
                first_started=now,
                now=now,
                ready=ready_by(asset, date, run.tags),
                interruptions=0,
                on_demand_after=None,
                current=IDLE,
            )
            return deadline_decision(facts)[0]

        return decide
