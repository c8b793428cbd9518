"""Spot-safe scoring for every domain: checkpointed shards, interruption handling, two budgets.

A scoring asset opens ``spot_safe(...)`` around its partitions and scores each one with
``run.partition(...)``. On an interruption the finished shards stay in staging and the step
leaves so it can be retried:

- the node is going away (SIGTERM, SIGINT, a cloud notice): the step fails without an in-process
  retry (the process is about to die) and tags its run so the daemon's ``run_retries``
  relaunches it (``FROM_FAILURE``); the relaunched run resumes from the checkpoint. The tags
  also carry the next attempt's capacity: the deadline-aware policy's choice from the day's
  work left and its ready-by (policy/ready_by.py), with ``on_demand_after``
  interruptions as an upper bound; today's count-based switch alone where no deadline applies.
- the node stays (SIGUSR1: the scheduler wants it for other work): ``RetryRequested`` retries
  the step in place after a pause.

Interruptions are counted durably in the partition's progress file and limited by
``interruption_budget``; errors in user code are limited by the job's ``RetryPolicy``. Dagster
counts both as retries of the same step, so nightshift keeps the interruption count itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any

from dagster import AssetExecutionContext, Failure, RetryRequested

from assets import killed_run
from assets.capacity import capacity_of, decide, retry_capacity, say_at_launch
from assets.errors import device_fault_failure
from assets.observability import GpuMonitor
from assets.partitions import PartitionReport
from inference.engine.day_run import AtLaunch, DaySettings, run_day
from inference.engine.faults import DeviceFault
from inference.engine.interrupt import InterruptionWatcher
from inference.engine.ledger import RunLedger, StartupShares
from inference.engine.local_pool import LocalPool
from inference.engine.oom_killed import OomKilledAttempt
from inference.engine.shards import Interrupted, ShardPool, Stalled, Watch
from inference.engine.work import Work
from policy.deadline import CapacityDecision
from policy.ready_by import ready_by
from policy.tags import (
    CAPACITY_REASON_TAG,
    INTERRUPTED_TAG,
    INTERRUPTIONS_TAG,
    PIPELINE_TAG,
    RETRY_NUMBER_TAG,
    RETRY_ON_STEP_FAILURE_TAG,
    SOFT_INTERRUPTIONS_TAG,
)
from resources.inference import InferenceResource
from resources.quality import StreamedSample
from resources.run_metrics import DayMetrics, MetricsSettings, RunMetrics
from resources.storage import DataStore, Published


def run_lineage(context: AssetExecutionContext) -> str:
    """The id shared by a run and all its retries: a retry may take over its lease at once."""
    return context.run.root_run_id or context.run_id


class SpotSafeRun:
    """Scores the partitions of one step in checkpointed shards, stopping on interruptions.

    Every partition's attempts are entered in its cost ledger (inference/engine/ledger.py): the day's
    metadata carries its node-seconds, rework and cost over all of them.
    """

    def __init__(
        self,
        context: AssetExecutionContext,
        store: DataStore,
        inference: InferenceResource,
        watcher: InterruptionWatcher,
        metrics: RunMetrics | None = None,
    ):
        self.context, self.store, self.inference, self.watcher = context, store, inference, watcher
        self.metrics = metrics or RunMetrics(MetricsSettings(), context.log.warning)
        # Each day's Prometheus series (None where none are configured), by asset and date.
        self.day_metrics: dict[tuple[str, str], DayMetrics | None] = {}
        self._pool: ShardPool | None = None
        self._resources = ExitStack()  # the Ray session and its actors, for this step
        # The node's time before the first partition is that partition's restart overhead,
        # priced in shares to the run's days; a step retried in place runs on the same node,
        # whose time the first try already counted.
        startup = StartupShares(_run_started(context) if context.retry_number == 0 else None)
        self.ledger = RunLedger(
            context.run_id,
            capacity_of(context.run.tags),
            inference.node_prices(),
            startup,
            list(context.partition_keys) if context.has_partition_key_range else [],
        )

    def pool(self) -> ShardPool:
        """Where this step's shards run, the inference resource's ``executor``: in this process
        (``local``) or on Ray workers (``ray``); started on first use, stopped with the step."""
        if self._pool is None:
            if self.inference.executor == "ray":
                self._pool = self._ray_pool()
            else:
                pool = LocalPool(self.stop, models=self._step_model)
                self._resources.callback(pool.close)
                self._pool = pool
        return self._pool

    def _step_model(self, key: str, loader: Callable[[], Any]) -> Any:
        """A model for shards run in this process: the one the step loaded under ``key``."""
        return self.inference.model(key, lambda runtime: loader())

    def _ray_pool(self) -> ShardPool:
        from inference.engine.ray_pool import open_ray_pool

        settings = self.inference
        pool = open_ray_pool(
            self._resources,
            settings.ray_address,
            settings.ray_workers,
            settings.ray_cpus_per_worker,
            settings.ray_gpus_per_worker,
        )
        where = settings.ray_address or "local Ray"
        self.context.log.info(
            f"shards run on {settings.ray_workers} Ray workers ({where}), "
            f"{settings.ray_cpus_per_worker:g} CPU and {settings.ray_gpus_per_worker:g} GPU each"
        )
        return pool

    def close(self) -> None:
        self._resources.close()
        self._pool = None

    def metadata(self) -> dict[str, Any]:
        """Retry counts of this step (error retries in this run, run-level relaunches), the
        latest committed day's ledger figures, and the reason for this run's capacity."""
        # Read fresh: the tag is added during this run, after the step context was built.
        tags = self.context.instance.get_run_by_id(self.context.run_id).tags
        soft = int(tags.get(SOFT_INTERRUPTIONS_TAG, 0))
        figures: dict = {
            "error_retries": self.context.retry_number - soft,
            "soft_interruptions": soft,
            "run_attempt": int(self.context.run.tags.get(RETRY_NUMBER_TAG, 0)) + 1,
        }
        figures.update(self.ledger.latest())
        if CAPACITY_REASON_TAG in tags:
            figures["capacity_reason"] = tags[CAPACITY_REASON_TAG]
        return figures

    def shard_rows(self, default: int, asked: int | None = None) -> int:
        """Input rows per shard: the asset's ``asked``, else the resource's, else ``default``;
        0 when the resource turns checkpointing off."""
        configured = self.inference.shard_rows
        if configured == 0:  # checkpointing off
            return 0
        return asked or configured or default

    def stop(self) -> str | None:
        notice = self.watcher.check()
        return notice.reason if notice else None

    def partition(
        self,
        asset: str,
        date: str,
        work: Work,
        sample: StreamedSample | None = None,
        audit: bool = False,
    ) -> PartitionReport:
        """Scores one partition (the day of table ``<asset>``) and commits it exactly once;
        ``sample`` takes the checks' sample as the rows stream, where shards run here. With
        ``audit`` the day is only staged (``report.shards.staged``): the caller publishes it
        once its checks pass."""
        settings = DaySettings(
            self.store.partition_target,
            self.store.fs,
            run_lineage(self.context),
            self.inference.lease_seconds,
            self.shard_rows,
            self.inference.max_batch_size,
            self.inference.stall_limit(),
            self.inference.batch_timeout(),
            self.inference.straggler_multiple,
            self.inference.progress_stream(),
            after_kill=killed_run.command(self.context.run.run_id),
        )
        quarantine = work.input.quarantine
        device = str(self.inference.runtime.device)
        observer = None
        if self.metrics.settings.enabled:
            rows = quarantine.rows if quarantine else None
            observer = self.metrics.day(
                asset, date, self._pipeline(), rows, device, self._cost_so_far, self._decide_now
            )
        self.day_metrics[asset, date] = observer
        at_launch = None
        if RETRY_NUMBER_TAG not in self.context.run.tags:
            # The policy's view at the day's first launch, from its ledger.
            where = f"{asset} {date}"

            def tell(facts: Callable[[], Any]) -> None:
                decision, why = decide(facts)
                self.decided(decision)
                say_at_launch(self.context, where, decision, why)

            at_launch = AtLaunch(tell, self.context.run.tags, self.inference.on_demand_after)
        pool = self.pool()
        with GpuMonitor(device) as gpu:
            ran = run_day(
                asset,
                date,
                work,
                settings,
                self.ledger,
                pool,
                self.stop,
                self.context.log.info,
                sample=sample,
                audit=audit,
                at_launch=at_launch,
                observer=observer,
            )
        shards = ran.shards
        published = Published(uri=shards.uri, rows=shards.rows_out, files=shards.shards)
        return PartitionReport(
            date,
            ran.metrics,
            published,
            shards,
            gpu=gpu.stats(),
            # The ledger's figures (metadata()) price the day over all its attempts.
            price=None,
            capacity=self.ledger.capacity,
            sample=sample.frame(published.rows) if sample is not None and pool.in_process else None,
            executor={**self._where(pool, ran.watch), **work.input.layout},
        )

    def decided(self, decision: CapacityDecision | None) -> None:
        """The capacity policy's decision for the open day, into its metrics."""
        day = self.ledger.open_day
        observer = self.day_metrics.get((day.asset, day.date)) if day is not None else None
        if observer is None:
            return
        deadline = ready_by(day.asset, day.date, self.context.run.tags) if decision else None
        observer.decided(decision, deadline.at.timestamp() if deadline else None)

    def _decide_now(self) -> None:
        """The capacity policy's view of the open day as it runs (its slack now), for its
        metrics: the run cannot move itself, but a day falling behind its ready-by shows."""
        day = self.ledger.open_day
        if day is None:
            return
        facts = partial(
            day.night_facts,
            day.writer.progress.interruptions,
            self.ledger.capacity,
            self.context.run.tags,
            self.inference.on_demand_after,
        )
        self.decided(decide(facts)[0])

    def left(self, exc: Interrupted) -> None:
        """The step leaves the open day on an interruption: its metrics say so."""
        day = self.ledger.open_day
        observer = self.day_metrics.get((day.asset, day.date)) if day is not None else None
        if observer is not None:
            observer.left(exc.interruptions)

    def _cost_so_far(self) -> float | None:
        """What the open day cost so far over its attempts, from its ledger."""
        day = self.ledger.open_day
        if day is None:
            return None
        return float(day.ledger.figures(self.ledger.prices)["cost_usd"])

    def _pipeline(self) -> str:
        """The job the run belongs to: Dagster's hidden asset job is named by its tag."""
        name = self.context.job_name
        if not name.startswith("__ASSET_JOB"):
            return name
        tags = self.context.instance.get_run_by_id(self.context.run_id).tags
        return tags.get(PIPELINE_TAG, name)

    def _where(self, pool: ShardPool, watch: Watch) -> dict[str, Any]:
        """Where the shards ran, for the metadata: nothing beyond the step when in process."""
        if pool.in_process:
            return {}
        settings = self.inference
        return {"executor": "ray", "worker_device": settings.device, **watch.figures.as_dict()}


@contextmanager
def spot_safe(
    context: AssetExecutionContext, store: DataStore, inference: InferenceResource
) -> Iterator[SpotSafeRun]:
    """Runs a scoring step under the interruption watcher and turns an interruption into a retry."""
    if context.run.tags.get(RETRY_ON_STEP_FAILURE_TAG) == "true":
        # Inherited from an interrupted parent run: this attempt starts with errors not retried
        # at run level again, until it is interrupted itself.
        context.instance.add_run_tags(context.run_id, {RETRY_ON_STEP_FAILURE_TAG: "false"})
    with (
        inference.watcher(on_advisory=context.log.warning) as watcher,
        inference.run_metrics(context.log.warning) as metrics,
    ):
        run = SpotSafeRun(context, store, inference, watcher, metrics)
        try:
            yield run
            if (line := run.ledger.range_line()) is not None:
                context.log.info(line)
        except Interrupted as exc:
            watcher.consume()
            # A stalled step leaves a stuck thread behind: its retry runs in a fresh process.
            node_lost = isinstance(exc, Stalled) or _node_lost(watcher)
            try:
                _leave_for_retry(context, inference, exc, node_lost=node_lost, run=run)
            finally:
                run.left(exc)  # pushed with the retry's capacity decision
        except DeviceFault as exc:
            context.log.error(exc.line)
            raise device_fault_failure(exc, *_left_day(run, exc)) from exc
        finally:
            run.close()


def _run_started(context: AssetExecutionContext) -> float | None:
    """When this run's process started (its node was up): the launch the ledger charges from."""
    record = context.instance.get_run_record_by_id(context.run_id)
    return record.start_time if record is not None else None


def _left_day(run: SpotSafeRun, fault: DeviceFault) -> tuple[str | None, int]:
    """The day the step left (asset and date) and its shards finished, kept in staging."""
    if isinstance(fault, OomKilledAttempt):  # found before the day was opened
        return fault.day, fault.shards_kept
    day = run.ledger.open_day
    if day is None:
        return None, 0
    return f"{day.asset} {day.date}", len(day.writer.progress.shards)


def _node_lost(watcher: InterruptionWatcher) -> bool:
    return watcher.notice is None or watcher.notice.node_lost


def _leave_for_retry(
    context: AssetExecutionContext,
    inference: InferenceResource,
    exc: Interrupted,
    node_lost: bool,
    run: SpotSafeRun | None = None,
) -> None:
    count, budget = exc.interruptions, inference.interruption_budget
    within_budget = count <= budget
    if not node_lost and within_budget:
        context.log.warning(f"{exc}; retrying in place")
        soft = int(
            context.instance.get_run_by_id(context.run_id).tags.get(SOFT_INTERRUPTIONS_TAG, 0)
        )
        context.instance.add_run_tags(context.run_id, {SOFT_INTERRUPTIONS_TAG: str(soft + 1)})
        raise RetryRequested(max_retries=context.retry_number + 1, seconds_to_wait=5) from exc
    tags = {INTERRUPTED_TAG: "true", INTERRUPTIONS_TAG: str(count)}
    metadata: dict[str, Any] = {"interruptions": count, "shards_done": exc.shards_done}
    if isinstance(exc, Stalled):
        context.log.error(str(exc))
        metadata.update(_stall_figures(exc))
    if within_budget:
        tags[RETRY_ON_STEP_FAILURE_TAG] = "true"
        day = run.ledger.open_day if run is not None else None
        decided = run.decided if run is not None else None
        tags.update(retry_capacity(context, inference.on_demand_after, count, day, decided))
    context.instance.add_run_tags(context.run_id, tags)
    what = (
        "the run will be relaunched and resume from the checkpoint"
        if within_budget
        else f"interruption budget of {budget} retries exhausted"
    )
    raise Failure(
        description=f"{exc}; {what}",
        metadata=metadata,
        allow_retries=False,
    ) from exc


def _stall_figures(exc: Stalled) -> dict[str, Any]:
    """Where the day stopped moving, for the failure's metadata."""
    stall = exc.stall
    figures: dict[str, Any] = {
        "stalled": True,
        "stall_waited_s": round(stall.waited, 1),
        "stall_limit_s": round(stall.limit, 1),
        "stall_batches_done": stall.batches,
    }
    if stall.shard is not None:
        figures["stall_shard"] = stall.shard
    return figures
