"""A run's Prometheus metrics: every scored day's figures, live while it runs and final once it
is recorded, pushed to a Pushgateway and served on a loopback port when configured.

Batch jobs end before a scrape would find them, so the convention is the Pushgateway: each day
is its own group (``job``, ``asset``, ``partition``), pushed with PUT (``push_to_gateway``),
which replaces the whole group. A day re-run after an interruption, or scored again, therefore
replaces what its earlier attempt pushed instead of adding to it, and a figure the new attempt
does not have (a decision, a token rate) is gone from the group, not left stale. Pushes happen
from the driver's shard loop at most every ``push_seconds`` and once more when the day is
recorded (or left on an interruption).

Nothing here may fail a day: with no Pushgateway and no port configured nothing is created or
sent, and a push that fails is logged as a warning and counted
(``nightshift_metrics_push_failures_total``, in the next push that gets through).

Counters hold the day's own figures, each row counted once over all its attempts: a retry
starts from the rows its earlier attempts finished, and its final push carries the same
numbers as the day's Dagster metadata. Histograms hold this attempt's model calls.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    make_wsgi_app,
    push_to_gateway,
)
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from inference.engine.metrics import FIRST_TOKEN_BUCKETS, BatchMetrics
from inference.engine.observer import ShardSeen
from policy.deadline import CapacityDecision

LABELS = ("asset", "partition", "pipeline")
FIRST_TOKEN = "gen_ai_server_time_to_first_token_seconds"
DEFAULT_JOB = "nightshift"
PUSH_TIMEOUT_SECONDS = 5.0
# How often the loopback server looks whether the run is over: the run's end waits for it
# (prometheus_client's own server looks every half second, a fixed cost on every run).
SERVE_POLL_SECONDS = 0.02

# Rows per model call: tabular calls run to tens of thousands of rows, text calls to a few dozen.
BATCH_SIZE_BUCKETS = (1, 8, 32, 128, 512, 1024, 4096, 16384, 65536, 262144)
# Seconds per model call, from a sub-millisecond tabular call to a long generation call.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass(frozen=True)
class MetricSpec:
    """One metric as it is exposed: name (counters with ``_total``), type, extra labels beside
    :data:`LABELS`, and its meaning (docs/monitoring.md lists the same)."""

    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = ()


# Every metric a run exposes; dashboards and alert rules import the names from here.
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("nightshift_rows_in_total", "counter", "Input rows of the day in finished shards, each counted once over all attempts."),
    MetricSpec("nightshift_rows_out_total", "counter", "Output rows: this attempt's so far while the day runs; the day's published rows once it is recorded."),
    MetricSpec("nightshift_rows_quarantined_total", "counter", "Rows quarantined instead of scored (known once the day is recorded)."),
    MetricSpec("nightshift_rows_redone_total", "counter", "Rows computed again after an interruption, counted apart from the day's rows."),
    MetricSpec("nightshift_interruptions_total", "counter", "Interruptions of the day over all its attempts (spot notices, signals, stalls)."),
    MetricSpec("nightshift_tokens_total", "counter", "Tokens of text models in this attempt: generation, the new tokens generated (padding and prompt not counted); embeddings and extractive summaries, the input tokens encoded (attention-mask sum)."),
    MetricSpec("nightshift_metrics_push_failures_total", "counter", "Pushes to the Pushgateway that failed (reported by the next push that gets through)."),
    MetricSpec("nightshift_rows_expected", "gauge", "Input rows the day has (its landed rows), when known."),
    MetricSpec("nightshift_rows_waiting", "gauge", "Input rows not yet in a finished shard."),
    MetricSpec("nightshift_shards_in_flight", "gauge", "Shards handed to the pool and not yet recorded."),
    MetricSpec("nightshift_shards_waiting", "gauge", "Shards not finished yet, estimated from the rows waiting and the mean finished shard."),
    MetricSpec("nightshift_rows_per_second", "gauge", "Input rows per second of this attempt (rows of resumed shards not counted)."),
    MetricSpec("nightshift_tokens_per_second", "gauge", "Tokens per second of this attempt (the tokens of nightshift_tokens_total)."),
    MetricSpec("nightshift_device_busy_ratio", "gauge", "Share of time the device was busy: GPU utilisation from NVML, else process CPU time over wall time and cores.", ("device",)),
    MetricSpec("nightshift_cost_usd", "gauge", "What the day cost so far over all its attempts, from the cost ledger."),
    MetricSpec("nightshift_deadline_slack_seconds", "gauge", "Time left to the ready-by minus work left, at the capacity policy's latest decision; negative: the deadline will be missed."),
    MetricSpec("nightshift_deadline_work_left_seconds", "gauge", "Work left at the capacity policy's latest decision."),
    MetricSpec("nightshift_ready_by_timestamp_seconds", "gauge", "The day's ready-by (deadline), epoch seconds."),
    MetricSpec("nightshift_capacity_decision", "gauge", "1 for the capacity policy's latest decision: the capacity chosen and the rule that chose it.", ("capacity", "rule")),
    MetricSpec("nightshift_deadline_cannot_make_it", "gauge", "1 when the policy found the ready-by cannot be met even on on-demand."),
    MetricSpec("nightshift_last_progress_timestamp_seconds", "gauge", "When the day last finished a shard, epoch seconds."),
    MetricSpec("nightshift_day_completed_timestamp_seconds", "gauge", "When the day was recorded, epoch seconds; absent while it runs."),
    MetricSpec("nightshift_batch_size_rows", "histogram", "Rows per model call (this attempt)."),
    MetricSpec("nightshift_batch_latency_seconds", "histogram", "Seconds per model call (this attempt); p50/p95/p99 by histogram_quantile."),
    # The OpenTelemetry GenAI semantic convention's gen_ai.server.time_to_first_token, in
    # Prometheus's spelling; vLLM's own is vllm:time_to_first_token_seconds.
    MetricSpec(FIRST_TOKEN, "histogram", "Seconds from the start of a generation model call to each request's first new token (this attempt; generation days only); OpenTelemetry GenAI gen_ai.server.time_to_first_token, vLLM's vllm:time_to_first_token_seconds."),
)  # fmt: skip
METRIC_NAMES: tuple[str, ...] = tuple(spec.name for spec in METRICS)


def _build(registry: CollectorRegistry) -> dict[str, Any]:
    """The metric objects of :data:`METRICS`, registered in ``registry``."""
    built: dict[str, Any] = {}
    for spec in METRICS:
        labels = (*LABELS, *spec.labels)
        if spec.kind == "counter":
            # prometheus_client adds the _total suffix itself.
            built[spec.name] = Counter(
                spec.name.removesuffix("_total"), spec.help, labels, registry=registry
            )
        elif spec.kind == "gauge":
            built[spec.name] = Gauge(spec.name, spec.help, labels, registry=registry)
        elif spec.name == FIRST_TOKEN:
            built[spec.name] = _FirstTokens(spec.help)
            registry.register(built[spec.name])
        else:
            buckets = BATCH_SIZE_BUCKETS if spec.name.endswith("_rows") else LATENCY_BUCKETS
            built[spec.name] = Histogram(
                spec.name, spec.help, labels, buckets=buckets, registry=registry
            )
    return built


@dataclass(frozen=True)
class MetricsSettings:
    """Where a run's metrics go. ``pushgateway``: its URL (``http://host:9091``), None for
    no pushes; ``push_seconds``: the least time between two pushes of a running day;
    ``port``: serve ``/metrics`` on 127.0.0.1 at this port, None for none; ``job``: the
    ``job`` of the Pushgateway groups."""

    pushgateway: str | None = None
    push_seconds: float = 30.0
    port: int | None = None
    job: str = DEFAULT_JOB

    @property
    def enabled(self) -> bool:
        return bool(self.pushgateway) or self.port is not None


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """A scrape a second is not news for the run's log."""


def _serve(registry: CollectorRegistry, port: int) -> WSGIServer:
    """Serves ``registry`` at http://127.0.0.1:``port``/metrics on a thread of its own."""
    server = make_server("127.0.0.1", port, make_wsgi_app(registry), handler_class=_Quiet)
    threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": SERVE_POLL_SECONDS},
        name="nightshift-metrics",
        daemon=True,
    ).start()
    return server


class RunMetrics:
    """One run's registry and its days. Use as a context manager: the loopback server, when
    configured, serves while the run is open."""

    def __init__(self, settings: MetricsSettings, warn: Callable[[str], None]):
        self.settings, self.warn = settings, warn
        self.registry = CollectorRegistry()
        self.metrics = _build(self.registry) if settings.enabled else {}
        self._server: Any = None

    def __enter__(self) -> RunMetrics:
        port = self.settings.port
        if port is not None:
            try:
                self._server = _serve(self.registry, port)
            except OSError as exc:  # a port taken must not fail the run: pushes still go
                self.warn(f"metrics not served on 127.0.0.1:{port} ({exc})")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def day(
        self,
        asset: str,
        date: str,
        pipeline: str,
        rows_expected: int | None = None,
        device: str = "cpu",
        cost: Callable[[], float | None] = lambda: None,
        refresh: Callable[[], None] = lambda: None,
    ) -> DayMetrics | None:
        """The metrics of one day about to run, or None where nothing is configured.
        ``cost``: the day's cost so far, read at each push of the running day; ``refresh``:
        called before each such push (the capacity policy's view of the day now)."""
        if not self.settings.enabled:
            return None
        return DayMetrics(
            self,
            {"asset": asset, "partition": date, "pipeline": pipeline},
            rows_expected,
            device,
            cost,
            refresh,
        )

    def push(self, day: DayMetrics) -> bool:
        """Pushes the day's group, replacing what the Pushgateway held for it; a failure is
        logged (once per day) and counted, never raised."""
        url = self.settings.pushgateway
        if not url:
            return False
        key = {"asset": day.labels["asset"], "partition": day.labels["partition"]}
        try:
            push_to_gateway(
                url,
                job=self.settings.job,
                registry=_DayView(self.registry, key),
                grouping_key=key,
                timeout=PUSH_TIMEOUT_SECONDS,
            )
        except Exception as exc:  # noqa: BLE001 - a monitoring outage must not fail the day
            self.metrics["nightshift_metrics_push_failures_total"].labels(**day.labels).inc()
            if not day.push_failed:
                self.warn(
                    f"{key['asset']} {key['partition']}: metrics push to {url} failed ({exc}); "
                    "the day goes on, pushes are retried and failures counted in "
                    "nightshift_metrics_push_failures_total"
                )
            day.push_failed = True
            return False
        return True


@dataclass
class DayMetrics:
    """One day's series in the run's registry: fed live by the shard loop (it is the day's
    :class:`~inference.engine.observer.DayObserver`), by the capacity policy's decisions, and
    finally from the day's recorded figures."""

    run: RunMetrics
    labels: dict[str, str]
    rows_expected: int | None
    device: str
    cost: Callable[[], float | None]
    refresh: Callable[[], None] = lambda: None
    push_failed: bool = False
    _decision: tuple[str, str] | None = None  # the capacity and rule of the latest decision
    _counted: dict[str, float] = field(default_factory=dict)
    _batches_seen: int = 0
    _started: float = field(default_factory=time.monotonic)
    _cpu_started: float = field(default_factory=time.process_time)
    _last_push: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.rows_expected is not None:
            self._gauge("nightshift_rows_expected").set(self.rows_expected)

    def shard_done(self, seen: ShardSeen) -> None:
        self._count("nightshift_rows_in_total", seen.rows_read)
        self._count("nightshift_rows_out_total", seen.metrics.rows_out)
        self._count("nightshift_rows_redone_total", seen.rows_redone)
        self._count("nightshift_interruptions_total", seen.interruptions)
        self._batches(seen.metrics)
        self._gauge("nightshift_shards_in_flight").set(seen.shards_in_flight)
        if self.rows_expected is not None:
            waiting = max(self.rows_expected - seen.rows_read, 0)
            self._gauge("nightshift_rows_waiting").set(waiting)
            if seen.shards_done:
                per_shard = max(seen.rows_read / seen.shards_done, 1.0)
                self._gauge("nightshift_shards_waiting").set(math.ceil(waiting / per_shard))
        elapsed = time.monotonic() - self._started
        if elapsed > 0:
            rate = (seen.rows_read - seen.rows_resumed) / elapsed
            self._gauge("nightshift_rows_per_second").set(rate)
        self._busy()
        self._gauge("nightshift_last_progress_timestamp_seconds").set(time.time())
        if time.monotonic() - self._last_push >= self.run.settings.push_seconds:
            self.push()

    def decided(self, decision: CapacityDecision | None, ready_by: float | None = None) -> None:
        """The capacity policy's latest decision for the day and its ready-by (epoch); with
        None (the policy did not apply) an earlier decision's series are withdrawn."""
        day = tuple(self.labels[k] for k in LABELS)
        choice = self.run.metrics["nightshift_capacity_decision"]
        if self._decision is not None:
            choice.remove(*day, *self._decision)
            self._decision = None
        if ready_by is not None:
            self._gauge("nightshift_ready_by_timestamp_seconds").set(ready_by)
        figures = {
            "nightshift_deadline_slack_seconds": lambda d: d.time_left_s - d.work_left_s,
            "nightshift_deadline_work_left_seconds": lambda d: d.work_left_s,
            "nightshift_deadline_cannot_make_it": lambda d: int(d.cannot_make_it),
        }
        for name, figure in figures.items():
            if decision is None:
                self.run.metrics[name].remove(*day)
            else:
                self._gauge(name).set(figure(decision))
        if decision is not None:
            self._decision = (decision.capacity, decision.rule)
            choice.labels(*day, *self._decision).set(1)

    def left(self, interruptions: int) -> None:
        """The day's attempt ends on an interruption: its count, then a push."""
        self._count("nightshift_interruptions_total", interruptions)
        self._busy()
        self.push(refresh=False)  # the decision for the retry stands

    def finish(
        self, figures: Mapping[str, Any], metrics: BatchMetrics, gpu: object | None = None
    ) -> None:
        """The day is recorded: its figures as its metadata holds them (``gpu``: the day's
        GPU use, with NVML's utilisation where there is one), then a push."""
        value = {k: getattr(v, "value", v) for k, v in figures.items()}
        for name, key in (
            ("nightshift_rows_in_total", "rows_in"),
            ("nightshift_rows_out_total", "rows_out"),
            ("nightshift_rows_quarantined_total", "rows_quarantined"),
            ("nightshift_rows_redone_total", "rows_redone"),
            ("nightshift_interruptions_total", "interruptions"),
            ("nightshift_tokens_total", "tokens"),
        ):
            if isinstance(value.get(key), int | float):
                self._count(name, value[key])
        for name, key in (
            ("nightshift_rows_per_second", "rows_per_second"),
            ("nightshift_tokens_per_second", "tokens_per_second"),
            ("nightshift_cost_usd", "cost_usd"),
        ):
            if isinstance(value.get(key), int | float):
                self._gauge(name).set(value[key])
        self._batches(metrics)
        self._gauge("nightshift_rows_waiting").set(0)
        self._gauge("nightshift_shards_waiting").set(0)
        self._gauge("nightshift_shards_in_flight").set(0)
        self._busy(getattr(gpu, "utilisation_pct", None))
        self.decided(None)  # nothing left to decide for a recorded day
        self._gauge("nightshift_day_completed_timestamp_seconds").set(time.time())
        self.push(final=True)

    def push(self, final: bool = False, refresh: bool = True) -> None:
        """Pushes the day's group; a running day's (not ``final``) with its cost so far and,
        with ``refresh``, the policy's view of it now."""
        if not final:
            if refresh:
                self.refresh()
            cost = self.cost()
            if cost is not None:
                self._gauge("nightshift_cost_usd").set(cost)
        self._last_push = time.monotonic()
        self.run.push(self)

    def _gauge(self, name: str) -> Any:
        return self.run.metrics[name].labels(**self.labels)

    def _count(self, name: str, total: float) -> None:
        """Raises the day's counter to ``total`` (counters only go up: a figure that fell
        behind what was counted is left as counted)."""
        counted = self._counted.get(name, 0.0)
        if total > counted:
            self.run.metrics[name].labels(**self.labels).inc(total - counted)
            self._counted[name] = total
        elif name not in self._counted:
            self.run.metrics[name].labels(**self.labels)  # the series exists at 0
            self._counted[name] = counted

    def _batches(self, metrics: BatchMetrics) -> None:
        """Observes the model calls not yet seen."""
        sizes = self.run.metrics["nightshift_batch_size_rows"].labels(**self.labels)
        latency = self.run.metrics["nightshift_batch_latency_seconds"].labels(**self.labels)
        for rows, seconds in zip(
            metrics.batch_sizes[self._batches_seen :],
            metrics.batch_seconds[self._batches_seen :],
            strict=True,
        ):
            sizes.observe(rows)
            latency.observe(seconds)
        self._batches_seen = len(metrics.batch_sizes)
        self.run.metrics[FIRST_TOKEN].set(self.labels, metrics)
        if metrics.tokens:
            self._count("nightshift_tokens_total", metrics.tokens)
            elapsed = time.monotonic() - self._started
            if elapsed > 0:
                self._gauge("nightshift_tokens_per_second").set(metrics.tokens / elapsed)

    def _busy(self, gpu_pct: float | None = None) -> None:
        """The device's busy share: the GPU's, where NVML gave it, else this process's CPU
        time over the wall time of the cores it may use."""
        busy = self.run.metrics["nightshift_device_busy_ratio"]
        if gpu_pct is not None:
            busy.labels(**self.labels, device="cuda").set(gpu_pct / 100)
            return
        if self.device.startswith("cuda"):
            return  # no NVML reading: a CPU share would say nothing of the GPU
        wall = time.monotonic() - self._started
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        if wall > 0:
            share = (time.process_time() - self._cpu_started) / (wall * (cores or 1))
            busy.labels(**self.labels, device="cpu").set(min(share, 1.0))


class _FirstTokens:
    """The time-to-first-token histogram of every day: each day's bucket counts as its batch
    metrics hold them, merged exactly over shards and workers (a ``Histogram`` could only
    observe single values again). A day with no generation request has no series."""

    def __init__(self, documentation: str):
        self.documentation = documentation
        self.days: dict[tuple[str, ...], tuple[list[int], float]] = {}

    def set(self, labels: Mapping[str, str], metrics: BatchMetrics) -> None:
        if metrics.first_tokens:
            day = tuple(labels[k] for k in LABELS)
            self.days[day] = (list(metrics.first_token_counts), metrics.first_token_sum)

    def collect(self) -> Iterator[Metric]:
        if not self.days:
            return
        family = HistogramMetricFamily(FIRST_TOKEN, self.documentation, labels=LABELS)
        bounds = [*(floatToGoString(b) for b in FIRST_TOKEN_BUCKETS), "+Inf"]
        # A copy: the loopback server collects while the shard loop sets.
        for day, (counts, total) in list(self.days.items()):
            cumulative = itertools.accumulate(counts)
            family.add_metric(day, list(zip(bounds, cumulative, strict=True)), total)
        yield family


class _DayView:
    """The samples of one day (its ``asset`` and ``partition``) in the run's registry: what
    its Pushgateway group holds, so a range run's days are pushed each to its own group."""

    def __init__(self, registry: CollectorRegistry, key: Mapping[str, str]):
        self.registry, self.key = registry, key

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            kept = [
                s for s in family.samples if all(s.labels.get(k) == v for k, v in self.key.items())
            ]
            if not kept:
                continue
            view = Metric(family.name, family.documentation, family.type, family.unit)
            view.samples = kept
            yield view
