"""Spot-safe scoring for every domain: checkpointed shards, interruption handling, two budgets.

A scoring asset opens ``spot_safe(...)`` around its partitions and scores each one with
``run.partition(...)``. On an interruption the finished shards stay in staging and the step
leaves so it can be retried:

- the node is going away (SIGTERM, SIGINT, a cloud notice): the step fails without an in-process
  retry (the process is about to die) and tags its run so the daemon's ``run_retries``
  relaunches it (``FROM_FAILURE``); the relaunched run resumes from the checkpoint. The tags
  also carry the next attempt's capacity: the deadline-aware policy's choice from the day's
  work left and its ready-by (assets/deadline_capacity.py), with ``on_demand_after``
  interruptions as an upper bound; today's count-based switch alone where no deadline applies.
- the node stays (SIGUSR1: the scheduler wants it for other work): ``RetryRequested`` retries
  the step in place after a pause.

Interruptions are counted durably in the partition's progress file and limited by
``interruption_budget``; errors in user code are limited by the job's ``RetryPolicy``. Dagster
counts both as retries of the same step, so nightshift keeps the interruption count itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from dagster import AssetExecutionContext, Failure, RetryRequested

from assets.common import PartitionReport
from assets.deadline_capacity import NightFacts, deadline_decision, retry_tags
from assets.observability import GpuMonitor
from inference.distributed import (
    FixedProgram,
    ShardFunctions,
    ShardInput,
    ShardJob,
    ShardPool,
    ShardProgram,
    WorkerFigures,
    row_range_shards,
    run_distributed,
)
from inference.interrupt import InterruptionWatcher
from inference.ledger import Attempt, LedgerBook, PartitionLedger, recent_rate, sum_figures
from inference.metrics import BatchMetrics
from inference.output_partition import ShardReport
from inference.quarantine import QuarantinePlan
from inference.shards import (
    CountOut,
    Interrupted,
    Observe,
    ObservePrepared,
    ShardedWriter,
    Side,
    fingerprint,
    input_fingerprint,
    run_sharded,
)
from policy.deadline import IDLE, CapacityDecision
from policy.ready_by import ready_by
from policy.tags import (
    CAPACITY_REASON_TAG,
    CAPACITY_TAG,
    INTERRUPTED_TAG,
    INTERRUPTIONS_TAG,
    ON_DEMAND,
    RETRY_NUMBER_TAG,
    RETRY_ON_STEP_FAILURE_TAG,
    SOFT_INTERRUPTIONS_TAG,
)
from resources.inference import InferenceResource
from resources.quality import StreamedSample
from resources.storage import DataStore, Published

# Input rows per shard unless the asset or the resource says otherwise.
DEFAULT_SHARD_ROWS = 50_000


# At most one progress line per partition this often: a long partition shows how far it got
# without a line per shard in the event log.
PROGRESS_LOG_SECONDS = 10.0


class ProgressLog:
    """Logs how far a partition got, throttled to one line every ``every`` seconds.

    ``fraud_scores 2026-03-01: 2,500,000 of 10,000,000 rows (25%) in 10 shards, 1,020,000
    rows/s, about 7 s to go``; without a known total, the rows and rate alone.
    """

    def __init__(
        self,
        log: Callable[[str], None],
        what: str,
        total: int | None,
        every: float = PROGRESS_LOG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.log, self.what, self.total, self.every, self.clock = log, what, total, every, clock
        self.started = self.last = clock()

    def __call__(self, rows: int, resumed: int, shards: int) -> None:
        now = self.clock()
        if now - self.last < self.every:
            return
        self.last = now
        # Shards an earlier attempt finished were only read past: not this attempt's speed.
        rate = (rows - resumed) / max(now - self.started, 1e-9)
        line = f"{self.what}: {rows:,}"
        if self.total:
            line += f" of {self.total:,} rows ({rows / self.total:.0%})"
        else:
            line += " rows"
        line += f" in {shards} shard{'' if shards == 1 else 's'}, {rate:,.0f} rows/s"
        if self.total and rate > 0 and rows < self.total:
            line += f", about {(self.total - rows) / rate:,.0f} s to go"
        self.log(line)


def quarantine_asset(asset: str) -> str:
    """Where an asset's quarantined rows are published: ``outputs/<asset>_quarantine/``."""
    return f"{asset}_quarantine"


def capacity_of(tags: dict[str, str]) -> str:
    """The capacity a run was launched on: on-demand once the spot swap moved it there."""
    return "on_demand" if tags.get(CAPACITY_TAG) == ON_DEMAND else "spot"


def run_lineage(context: AssetExecutionContext) -> str:
    """The id shared by a run and all its retries: a retry may take over its lease at once."""
    return context.run.root_run_id or context.run_id


@dataclass
class Shards:
    """How the ``ray`` executor cuts a partition and builds each shard's functions.

    Args:
        program: builds a shard's functions in the worker from the rows it scores (the model
            loaded there once per worker, per-shard state built there).
        inputs: the shards, each carrying all the rows its state depends on (fraud: every row
            of a set of accounts); called once staging is settled. None: the local engine's
            row ranges of the Work's ``batches``.
        layout: what decides which rows a shard holds; part of the checkpoint's fingerprint,
            so progress of another layout is never mixed in.
    """

    program: ShardProgram
    inputs: Callable[[], Iterable[ShardInput]] | None = None
    layout: dict = field(default_factory=lambda: {"shard_layout": "row_ranges"})


@dataclass
class Work:
    """One partition's scoring, as a domain describes it to the spot-safe engine.

    Args:
        schema: the output schema.
        batches: the input stream, in a deterministic order.
        transform: the model step ``(batch, prepared) -> output rows``.
        inputs: the input files; their identity is part of the checkpoint's fingerprint.
        depends_on: whatever else decides the output (model version, settings); a change
            discards old progress instead of mixing outputs.
        prepare: CPU-side preparation, run ahead in a background thread.
        batch_size: rows per model call (default: the resource's ``max_batch_size``).
        shard_rows: rows per shard for this run (e.g. from the asset's config); ignored when
            the resource turns checkpointing off.
        default_shard_rows: rows per shard when neither ``shard_rows`` nor the resource sets
            it: cheap rows (a tabular score) want bigger shards than expensive ones.
        metrics: where timings go.
        quarantine: rows to set aside, published to ``outputs/<asset>_quarantine/``.
        observe: adds each output batch to the partition's exact statistics.
        count_out: input rows an output batch answers for (default: its row count).
        side: ``(asset, schema, pick)``: a side output published to ``outputs/<asset>/`` in
            the same commit, ``pick(rows scored, their output)`` choosing its rows.
        observe_prepared: adds each model call's prepared input (what ``prepare`` returned)
            to the shard's exact statistics.
        sample: the output checks' row sample, taken as the rows stream (else read back);
            not taken when shards run elsewhere (their rows do not pass through this process).
        shards: how to cut the partition for the ``ray`` executor when its rows depend on
            other rows; without it, ``ray`` cuts the input into row ranges as ``local`` does,
            and ships the functions above to the workers.
    """

    schema: pa.Schema
    batches: Iterable[pa.RecordBatch]
    transform: Callable[[pa.RecordBatch, Any], pa.Table | pa.RecordBatch]
    inputs: list[str]
    depends_on: Any
    prepare: Callable[[pa.RecordBatch], Any] | None = None
    batch_size: int | None = None
    shard_rows: int | None = None
    default_shard_rows: int = DEFAULT_SHARD_ROWS
    metrics: BatchMetrics = field(default_factory=BatchMetrics)
    quarantine: QuarantinePlan | None = None
    observe: Observe | None = None
    count_out: CountOut | None = None
    side: tuple[str, pa.Schema, Side] | None = None
    observe_prepared: ObservePrepared | None = None
    sample: StreamedSample | None = None
    shards: Shards | None = None

    def functions(self) -> ShardFunctions:
        return ShardFunctions(
            self.transform,
            self.prepare,
            self.observe,
            self.count_out,
            self.side[2] if self.side else None,
            self.observe_prepared,
        )


@dataclass
class OpenDay:
    """The partition being scored now: its writer, its ledger and this attempt's entry."""

    asset: str
    date: str
    writer: ShardedWriter
    book: LedgerBook
    ledger: PartitionLedger
    attempt: Attempt
    # Whether the ledger file is ours to write: not while a committed day's ledger is stored
    # and this attempt has scored nothing (the day may turn out committed by this lineage).
    saving: bool

    def rows_done(self) -> int:
        """Input rows in the shards finished so far, by this attempt or earlier ones."""
        return sum(int(e["rows_in"]) for e in self.writer.progress.shards.values())

    def save(self) -> None:
        self.attempt.ended = time.time()
        self.attempt.rows_redone = self.writer.report.rows_redone
        if self.saving:
            self.book.save(self.ledger)


class SpotSafeRun:
    """Scores the partitions of one step in checkpointed shards, stopping on interruptions.

    Every partition's attempts are entered in its cost ledger (inference/ledger.py): the day's
    metadata carries its node-seconds, rework and cost over all of them.
    """

    def __init__(
        self,
        context: AssetExecutionContext,
        store: DataStore,
        inference: InferenceResource,
        watcher: InterruptionWatcher,
    ):
        self.context, self.store, self.inference, self.watcher = context, store, inference, watcher
        self._pool: ShardPool | None = None
        self._resources = ExitStack()  # the Ray session and its actors, for this step
        self.prices = inference.node_prices()
        # The node's time before the first partition is that partition's restart overhead; a
        # step retried in place runs on the same node, whose time the first try already counted.
        self._launched = _run_started(context) if context.retry_number == 0 else None
        self.open_day: OpenDay | None = None
        self.days: dict[str, dict] = {}  # each committed day's ledger figures

    @property
    def distributed(self) -> bool:
        """Whether shards run on workers elsewhere (``executor: ray``)."""
        return self.inference.executor == "ray"

    def pool(self) -> ShardPool:
        """The step's shard workers, started on first use and stopped with the step."""
        if self._pool is None:
            from inference.ray_pool import RayPool, ray_session

            settings = self.inference
            ray = self._resources.enter_context(
                ray_session(
                    settings.ray_address,
                    settings.ray_workers * settings.ray_cpus_per_worker,
                    settings.ray_workers * settings.ray_gpus_per_worker,
                )
            )
            pool = RayPool(
                ray,
                settings.ray_workers,
                settings.ray_cpus_per_worker,
                settings.ray_gpus_per_worker,
            )
            self._resources.callback(pool.close)
            self._pool = pool
            where = settings.ray_address or "local Ray"
            self.context.log.info(
                f"shards run on {settings.ray_workers} Ray workers ({where}), "
                f"{settings.ray_cpus_per_worker:g} CPU and {settings.ray_gpus_per_worker:g} GPU each"
            )
        return self._pool

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
        if self.days:
            # The latest day's: a range run asks after each of its days.
            figures.update(next(reversed(self.days.values())))
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

    def partition(self, asset: str, date: str, work: Work) -> PartitionReport:
        """Scores one partition (``outputs/<asset>/date=<date>/``) and commits it exactly once."""
        metrics, quarantine, side = work.metrics, work.quarantine, work.side
        decided_by = [input_fingerprint(self.store.fs, work.inputs), work.depends_on]
        if quarantine is not None:
            decided_by.append(quarantine.digest())
        if self.distributed and work.shards is not None:
            decided_by.append(work.shards.layout)
        writer = ShardedWriter(
            self.store.partition_target(asset, date),
            work.schema,
            fingerprint(*decided_by),
            self.shard_rows(work.default_shard_rows, work.shard_rows),
            run_lineage(self.context),
            self.inference.lease_seconds,
            quarantine=(
                self.store.partition_target(quarantine_asset(asset), date) if quarantine else None
            ),
            side=self.store.partition_target(side[0], date) if side else None,
            side_schema=side[1] if side else None,
        )
        log = ProgressLog(
            self.context.log.info, f"{asset} {date}", quarantine.rows if quarantine else None
        )
        day = self._open(asset, date, writer, quarantine.rows if quarantine else None)

        def progress(rows: int, resumed: int, shards: int) -> None:
            log(rows, resumed, shards)
            day.attempt.rows, day.saving = rows - resumed, True
            day.save()

        executor: dict = {}
        try:
            with GpuMonitor(str(self.inference.runtime.device)) as gpu:
                if self.distributed:
                    shards, executor = self._on_workers(writer, work, progress, self.pool())
                else:
                    shards = run_sharded(
                        writer,
                        work.batches,
                        work.transform,
                        batch_size=work.batch_size or self.inference.max_batch_size,
                        prepare=work.prepare,
                        stop=self.stop,
                        metrics=metrics,
                        quarantine=quarantine,
                        observe=work.observe,
                        count_out=work.count_out,
                        side=side[2] if side else None,
                        observe_prepared=work.observe_prepared,
                        progress=progress,
                    )
        except Interrupted:
            day.attempt.interrupted = True
            raise
        finally:
            day.save()
        self._close(day, shards)
        if shards.shards_resumed or shards.rows_redone:
            self.context.log.info(
                f"{asset} {date}: resumed {shards.shards_resumed} finished shards, "
                f"redid {shards.rows_redone} rows (attempt {shards.attempt})"
            )
        # Rows in and out describe the whole partition, resumed shards included; the batch
        # figures (batches, rows_computed) describe the work this attempt did.
        metrics.rows_in, metrics.rows_out = shards.rows_in, shards.rows_out
        published = Published(uri=shards.uri, rows=shards.rows_out, files=shards.shards)
        return PartitionReport(
            date,
            metrics.finish(),
            published,
            shards,
            gpu=gpu.stats(),
            # The ledger's figures (metadata()) price the day over all its attempts.
            price=None,
            capacity=capacity_of(self.context.run.tags),
            sample=work.sample.frame(published.rows) if work.sample and not executor else None,
            executor=executor,
        )

    def _open(self, asset: str, date: str, writer: ShardedWriter, rows: int | None) -> OpenDay:
        """Enters this attempt in the day's ledger; at the day's first attempt, says early
        when the day cannot make its ready-by."""
        book = LedgerBook(writer.target, asset, date)
        ledger = book.open()
        now = time.time()
        started = self._launched if self._launched is not None else now
        self._launched = None
        attempt = Attempt(
            self.context.run_id, capacity_of(self.context.run.tags), started, now, now
        )
        ledger.attempts.append(attempt)
        if rows is not None:
            ledger.rows_total = rows
        day = OpenDay(asset, date, writer, book, ledger, attempt, saving=len(ledger.attempts) > 1)
        day.save()
        self.open_day = day
        if len(ledger.attempts) == 1 and RETRY_NUMBER_TAG not in self.context.run.tags:
            self._at_launch(day)
        return day

    def _close(self, day: OpenDay, shards: ShardReport) -> None:
        """Closes the day's ledger at its commit and keeps its figures for the metadata."""
        ledger = day.ledger
        if shards.already_committed and not day.saving:
            # Committed and recorded by an earlier attempt: that attempt's ledger holds the day.
            stored = day.book.io.read_json(day.book.path)
            ledger = PartitionLedger.from_json(stored) if stored else ledger
        else:
            ledger.rows_total, ledger.committed = shards.rows_in, True
            day.book.save(ledger)
        self.days[day.date] = ledger.figures(self.prices)
        self.open_day = None

    def night_facts(self, day: OpenDay, interruptions: int, current: str) -> NightFacts:
        """What the capacity policy is told about the day: rows left, the asset's recent rate
        and restart overhead (this day's own before any day was committed), its ready-by."""
        recent = day.book.recent()
        rate = recent_rate(recent) or day.ledger.rows_per_second()
        overheads = [o for x in (day.ledger, *recent) if (o := x.restart_overhead_s())]
        totals = [x.rows_total for x in recent if x.rows_total]
        total = day.ledger.rows_total or (round(sum(totals) / len(totals)) if totals else None)
        return NightFacts(
            rows_left=max((total or 0) - day.rows_done(), 0),
            rows_total=total,
            rows_per_second=rate,
            restart_overhead_s=overheads[0] if overheads else None,
            first_started=day.ledger.attempts[0].started,
            now=time.time(),
            ready=ready_by(day.asset, day.date, self.context.run.tags),
            interruptions=interruptions,
            on_demand_after=self.inference.on_demand_after,
            current=current,
        )

    def _at_launch(self, day: OpenDay) -> None:
        """The policy's view at a day's first launch: the run cannot move itself, but a day
        that cannot make its ready-by says so now, on its run and in its log."""
        decision, why = self.night_facts_decision(day, 0, capacity_of(self.context.run.tags))
        if decision is None:
            return
        self.context.instance.add_run_tags(
            self.context.run_id, {CAPACITY_REASON_TAG: decision.reason}
        )
        log = self.context.log.warning if decision.cannot_make_it else self.context.log.info
        log(f"{day.asset} {day.date} at launch: {why}")

    def night_facts_decision(
        self, day: OpenDay, interruptions: int, current: str = IDLE
    ) -> tuple[CapacityDecision | None, str]:
        """The deadline-aware decision for the day's next stretch, or None and why not; a
        ledger that cannot be read leaves the decision to the count-based switch, said so."""
        try:
            return deadline_decision(self.night_facts(day, interruptions, current))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return None, f"deadline-aware policy skipped ({exc}); the count-based switch decides"

    def _on_workers(
        self, writer: ShardedWriter, work: Work, progress: Callable, pool: ShardPool
    ) -> tuple:
        """Runs a partition's shards on ``pool``; the driver records and commits them."""
        # Without Shards the Work's own functions are shipped to the workers as they are.
        shards = work.shards or Shards(FixedProgram(work.functions()))
        inputs = shards.inputs or (lambda: row_range_shards(work.batches, writer.shard_rows))
        job = ShardJob(
            writer.files(),
            shards.program,
            work.batch_size or self.inference.max_batch_size,
            work.quarantine,
            writer.target.uri(writer.target.final_dir),
        )
        figures = WorkerFigures()
        report = run_distributed(
            writer,
            inputs,
            job,
            pool,
            stop=self.stop,
            metrics=work.metrics,
            progress=progress,
            figures=figures,
        )
        executor = {"executor": "ray", "worker_device": self.inference.device, **figures.as_dict()}
        return report, {**executor, **shards.layout}


@contextmanager
def spot_safe(
    context: AssetExecutionContext, store: DataStore, inference: InferenceResource
) -> Iterator[SpotSafeRun]:
    """Runs a scoring step under the interruption watcher and turns an interruption into a retry."""
    if context.run.tags.get(RETRY_ON_STEP_FAILURE_TAG) == "true":
        # Inherited from an interrupted parent run: this attempt starts with errors not retried
        # at run level again, until it is interrupted itself.
        context.instance.add_run_tags(context.run_id, {RETRY_ON_STEP_FAILURE_TAG: "false"})
    with inference.watcher(on_advisory=context.log.warning) as watcher:
        run = SpotSafeRun(context, store, inference, watcher)
        try:
            yield run
            _log_range_cost(context, run)
        except Interrupted as exc:
            watcher.consume()
            _leave_for_retry(context, inference, exc, node_lost=_node_lost(watcher), run=run)
        finally:
            run.close()


def _run_started(context: AssetExecutionContext) -> float | None:
    """When this run's process started (its node was up): the launch the ledger charges from."""
    record = context.instance.get_run_record_by_id(context.run_id)
    return record.start_time if record is not None else None


def _log_range_cost(context: AssetExecutionContext, run: SpotSafeRun) -> None:
    """A range run's days added up, in one line of its log."""
    if len(run.days) < 2:
        return
    total = sum_figures(run.days.values())
    context.log.info(
        f"{len(run.days)} days: ${total['cost_usd']:.4f} {run.prices.label} "
        f"(${total['cost_on_demand_usd']:.4f} all on on-demand, saving "
        f"{total['saving_pct']:.0f}%); {total['node_s_spot']:.1f} node-s on spot, "
        f"{total['node_s_on_demand']:.1f} on on-demand, {total['rework_s']:.1f} s of rework "
        f"(${total['cost_rework_usd']:.4f})"
    )


def _retry_capacity(
    context: AssetExecutionContext,
    inference: InferenceResource,
    count: int,
    run: SpotSafeRun | None,
) -> dict[str, str]:
    """The retry's capacity tags: the deadline-aware policy's choice for the interrupted day
    (its node is gone: idle), logged with its reason; the count-based switch where the policy
    does not apply."""
    day = run.open_day if run is not None else None
    decision, why = (None, "") if day is None else run.night_facts_decision(day, count)
    if day is not None:
        log = context.log.warning if decision and decision.cannot_make_it else context.log.info
        log(f"{day.asset} {day.date} retry: {why}")
    return retry_tags(decision, count, inference.on_demand_after, context.run.tags)


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
    if within_budget:
        tags[RETRY_ON_STEP_FAILURE_TAG] = "true"
        tags.update(_retry_capacity(context, inference, count, run))
    context.instance.add_run_tags(context.run_id, tags)
    what = (
        "the run will be relaunched and resume from the checkpoint"
        if within_budget
        else f"interruption budget of {budget} retries exhausted"
    )
    raise Failure(
        description=f"{exc}; {what}",
        metadata={"interruptions": count, "shards_done": exc.shards_done},
        allow_retries=False,
    ) from exc
