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

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from dagster import AssetExecutionContext, Failure, RetryRequested

from assets.observability import GpuMonitor
from assets.partitions import PartitionReport
from inference.engine.interrupt import InterruptionWatcher
from inference.engine.ledger import (
    Attempt,
    LedgerBook,
    PartitionLedger,
    StartupShares,
    recent_rate,
    sum_figures,
)
from inference.engine.local_pool import LocalPool
from inference.engine.metrics import BatchMetrics
from inference.engine.output_partition import ShardReport, fingerprint, input_fingerprint
from inference.engine.quarantine import QuarantinePlan
from inference.engine.shard_worker import (
    FixedProgram,
    ModelStep,
    ShardInput,
    ShardJob,
    ShardProgram,
)
from inference.engine.shard_writer import ShardedWriter, ShardFileTargets
from inference.engine.shards import Interrupted, ShardPool, Watch, row_range_shards, run_partition
from policy.deadline import IDLE, CapacityDecision
from policy.ready_by import NightFacts, deadline_decision, ready_by, retry_tags
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


ROW_RANGES = {"shard_layout": "row_ranges"}


@dataclass
class Input:
    """A partition's input: its rows, how they are cut into shards, what is set aside.

    Args:
        batches: the input stream in a deterministic order, cut into row ranges of the
            partition's shard rows.
        shards: instead, the domain's own cut, called once staging is settled: each shard
            carries every row its state depends on (fraud: all rows of a set of accounts).
        quarantine: rows to set aside, never scored, published to
            ``outputs/<asset>_quarantine/``; the runner fails the day above its limit.
        files: the input files, whose identity is part of the checkpoint's fingerprint
            (the runner's default: the spec's dataset's landing files of the day).
        layout: what decides which rows a shard holds; part of the fingerprint, so progress
            of another layout is never mixed in.
    """

    batches: Iterable[pa.RecordBatch] = ()
    shards: Callable[[], Iterable[ShardInput]] | None = None
    quarantine: QuarantinePlan | None = None
    files: list[str] | None = None
    layout: dict = field(default_factory=lambda: dict(ROW_RANGES))


@dataclass(frozen=True)
class Output:
    """What a partition publishes.

    Args:
        schema: the output schema.
        side: ``(asset, schema)`` of a side output published in the same commit, its rows
            picked by the model step's ``side``.
        sample: take the output checks' row sample as the rows stream (True, or the columns
            to keep), where shards run in this process; else the checks read it back.
    """

    schema: pa.Schema
    side: tuple[str, pa.Schema] | None = None
    sample: bool | tuple[str, ...] = False


@dataclass(frozen=True)
class Sizes:
    """Rows per model call and per checkpointed shard.

    Args:
        batch_size: rows per model call (default: the resource's ``max_batch_size``).
        shard_rows: rows per shard for this run (e.g. from the asset's config); ignored when
            the resource turns checkpointing off.
        default_shard_rows: rows per shard when neither ``shard_rows`` nor the resource sets
            it: cheap rows (a tabular score) want bigger shards than expensive ones.
    """

    batch_size: int | None = None
    shard_rows: int | None = None
    default_shard_rows: int = DEFAULT_SHARD_ROWS


@dataclass
class Work:
    """One partition's scoring, as a domain describes it to the spot-safe engine.

    Args:
        input: the rows, their shards and quarantine.
        program: builds each shard's model step where the shard runs (its model through
            ``worker_model``); a :class:`ModelStep` when it needs nothing from the shard.
        output: the schema, side output and sample.
        depends_on: whatever else decides the output (model version, settings); a change
            discards old progress instead of mixing outputs.
        sizes: rows per model call and per shard.
    """

    input: Input
    program: ShardProgram | ModelStep
    output: Output
    depends_on: Any
    sizes: Sizes = field(default_factory=Sizes)


@dataclass(frozen=True)
class SampledProgram:
    """A program whose steps also hand their output to the checks' sample (in this process)."""

    program: ShardProgram
    sample: StreamedSample
    columns: tuple[str, ...] | None

    def __call__(self, rows: pa.Table) -> ModelStep:
        step = self.program(rows)
        observe, sample, columns = step.observe, self.sample, self.columns

        def sampled(scored: pa.RecordBatch, out: pa.Table, stats) -> None:
            if observe is not None:
                observe(scored, out, stats)
            sample.add(out.select(list(columns)) if columns else out)

        return replace(step, observe=sampled)


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

    Every partition's attempts are entered in its cost ledger (inference/engine/ledger.py): the day's
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
        # The node's time before the first partition is that partition's restart overhead,
        # priced in shares to the run's days; a step retried in place runs on the same node,
        # whose time the first try already counted.
        self.startup = StartupShares(_run_started(context) if context.retry_number == 0 else None)
        self._dates = list(context.partition_keys) if context.has_partition_key_range else []
        self.open_day: OpenDay | None = None
        self.days: dict[str, dict] = {}  # each committed day's ledger figures

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
        from inference.engine.ray_pool import RayPool, ray_session

        settings = self.inference
        ray = self._resources.enter_context(
            ray_session(
                settings.ray_address,
                settings.ray_workers * settings.ray_cpus_per_worker,
                settings.ray_workers * settings.ray_gpus_per_worker,
            )
        )
        pool = RayPool(
            ray, settings.ray_workers, settings.ray_cpus_per_worker, settings.ray_gpus_per_worker
        )
        self._resources.callback(pool.close)
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
        writer = self._writer(asset, date, work, audit)
        quarantine = work.input.quarantine
        log = ProgressLog(
            self.context.log.info, f"{asset} {date}", quarantine.rows if quarantine else None
        )
        day = self._open(asset, date, writer, quarantine.rows if quarantine else None)

        def progress(rows: int, resumed: int, shards: int) -> None:
            log(rows, resumed, shards)
            day.attempt.rows, day.saving = rows - resumed, True
            day.save()

        pool = self.pool()
        sample = sample if pool.in_process else None
        watch = Watch(self.stop, progress, BatchMetrics())
        try:
            with GpuMonitor(str(self.inference.runtime.device)) as gpu:
                shards = run_partition(
                    writer, self._shards(work, writer), self._job(work, writer, sample), pool, watch
                )
        except BaseException as exc:
            # The run leaves on this day: its later days will not take their start-up shares.
            day.attempt.startup_share_s = (day.attempt.startup_share_s or 0.0) + self.startup.rest()
            day.attempt.interrupted = isinstance(exc, Interrupted)
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
        metrics = watch.metrics
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
            sample=sample.frame(published.rows) if sample is not None else None,
            executor={**self._where(pool, watch), **work.input.layout},
        )

    def _writer(self, asset: str, date: str, work: Work, audit: bool = False) -> ShardedWriter:
        """The partition's writer, its fingerprint made of everything that decides the output."""
        quarantine, side = work.input.quarantine, work.output.side
        decided_by = [input_fingerprint(self.store.fs, work.input.files or []), work.depends_on]
        if quarantine is not None:
            decided_by.append(quarantine.digest())
        decided_by.append(work.input.layout)
        where = ShardFileTargets(
            self.store.partition_target(asset, date),
            work.output.schema,
            self.store.partition_target(quarantine_asset(asset), date) if quarantine else None,
            self.store.partition_target(side[0], date) if side else None,
            side[1] if side else None,
        )
        return ShardedWriter(
            where,
            fingerprint(*decided_by),
            self.shard_rows(work.sizes.default_shard_rows, work.sizes.shard_rows),
            run_lineage(self.context),
            self.inference.lease_seconds,
            audit=audit,
        )

    def _shards(self, work: Work, writer: ShardedWriter) -> Callable[[], Iterable[ShardInput]]:
        """The partition's shards: the domain's own cut, else row ranges of its batches."""
        if work.input.shards is not None:
            return work.input.shards
        return lambda: row_range_shards(work.input.batches, writer.shard_rows)

    def _job(self, work: Work, writer: ShardedWriter, sample: StreamedSample | None) -> ShardJob:
        program = work.program
        if isinstance(program, ModelStep):
            program = FixedProgram(program)
        if sample is not None:
            columns = work.output.sample
            program = SampledProgram(program, sample, None if columns is True else columns)
        return ShardJob(
            writer.files(),
            program,
            work.sizes.batch_size or self.inference.max_batch_size,
            work.input.quarantine,
            writer.target.uri(writer.target.data_dir()),
        )

    def _where(self, pool: ShardPool, watch: Watch) -> dict[str, Any]:
        """Where the shards ran, for the metadata: nothing beyond the step when in process."""
        if pool.in_process:
            return {}
        settings = self.inference
        return {"executor": "ray", "worker_device": settings.device, **watch.figures.as_dict()}

    def _open(self, asset: str, date: str, writer: ShardedWriter, rows: int | None) -> OpenDay:
        """Enters this attempt in the day's ledger; at the day's first attempt, says early
        when the day cannot make its ready-by."""
        book = LedgerBook(writer.target, asset, date)
        ledger = book.open()
        now = time.time()
        started, share = self.startup.open(now, self._days_left(date))
        capacity = capacity_of(self.context.run.tags)
        attempt = Attempt(self.context.run_id, capacity, started, now, now, startup_share_s=share)
        ledger.attempts.append(attempt)
        if rows is not None:
            ledger.rows_total = rows
        day = OpenDay(asset, date, writer, book, ledger, attempt, saving=len(ledger.attempts) > 1)
        day.save()
        self.open_day = day
        if len(ledger.attempts) == 1 and RETRY_NUMBER_TAG not in self.context.run.tags:
            self._at_launch(day)
        return day

    def _days_left(self, date: str) -> int:
        """This day and the run's days after it: the days what is left of the start-up is
        shared among (the runner scores a range's days in order)."""
        return len(self._dates) - self._dates.index(date) if date in self._dates else 1

    def _close(self, day: OpenDay, shards: ShardReport) -> None:
        """Closes the day's ledger at its commit and keeps its figures for the metadata."""
        ledger = day.ledger
        if shards.already_committed and not day.saving:
            # Committed and recorded by an earlier attempt: that attempt's ledger holds the day.
            stored = day.book.io.read_json(day.book.path)
            ledger = PartitionLedger.from_json(stored) if stored else ledger
            self.startup.give_back(day.attempt.startup_share_s or 0.0)
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
