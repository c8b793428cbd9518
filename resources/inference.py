"""The inference resource: device, precision and batch limits, and a lazy per-process model cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TextIO, TypeVar

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr

from inference.engine.batch_timeout import BatchTimeout
from inference.engine.device import Runtime, configure_cpu_threads, make_runtime
from inference.engine.interrupt import InterruptionWatcher, notice_source
from inference.engine.watchdog import StallLimit
from inference.text.workers import CPU_BATCH_TOKENS, GPU_BATCH_TOKENS
from policy.prices import NodePrices, node_prices_from_env
from policy.retries import INTERRUPTION_BUDGET
from resources.run_metrics import DEFAULT_JOB, MetricsSettings, RunMetrics

T = TypeVar("T")


class InferenceResource(ConfigurableResource):
    """Runs models on the best device present (CUDA when there is one, else CPU)."""

    device: str = Field(default="auto", description="auto | cpu | cuda | cuda:N | mps")
    precision: str = Field(default="auto", description="auto | fp32 | bf16 | fp16")
    max_batch_size: int = Field(default=4096, description="Rows per model call for tabular models.")
    max_batch_tokens: int | None = Field(
        default=None,
        description="Padded tokens per model call for text models; unset, 2,048 on a CPU "
        "(bigger calls only pad more there) and 16,384 on a GPU.",
    )
    cpu_threads: int | None = Field(
        default=None, description="Torch CPU threads; default all cores."
    )
    shard_rows: int | None = Field(
        default=None,
        description="Input rows per checkpointed shard; a retry redoes at most one shard. "
        "0 turns checkpointing off everywhere; unset, each asset uses its own default: "
        "250,000 transactions for fraud_scores (assets/fraud/scoring.py), 50,000 input rows "
        "for the other assets, users for user_recommendations (assets/checkpointing.py). The "
        "document assets shard by their docs_per_shard config instead (1,024 for "
        "document_summaries, 4,096 for document_embeddings), which this does not override.",
    )
    lease_seconds: float = Field(
        default=600.0, description="How long a partition's writer lease lasts between shards."
    )
    spot_notice: str = Field(
        # Not "off": the Launchpad reads an unquoted off as YAML 1.1's false and refuses it.
        default="signals",
        description="Cloud interruption notices to poll: signals (none: signals only; 'off' "
        "too) | aws | gcp | azure.",
    )
    spot_endpoint: str | None = Field(
        default=None, description="Metadata endpoint override for the notice source."
    )
    notice_poll_seconds: float = Field(default=5.0, description="How often to poll for notices.")
    interruption_budget: int = Field(
        # One budget (policy/retries.py): the jobs' dagster/max_retries tag carries the same
        # number, so the daemon stops relaunching where the step stops asking.
        default=INTERRUPTION_BUDGET,
        description="Retries after interruptions, counted apart from the error-retry budget.",
    )
    stall_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Progress watchdog: seconds without a model call finishing before the "
        "step gives up on the stuck work and fails for a retry; unset, derived from the day's "
        "own batch time (stall_batch_multiple x its median, between the floor and the "
        "ceiling); 0 turns the watchdog off.",
    )
    stall_floor_seconds: float = Field(
        default=StallLimit.floor, gt=0, description="The least stall limit derived from batches."
    )
    stall_ceiling_seconds: float = Field(
        default=StallLimit.ceiling,
        gt=0,
        description="The most stall limit derived from batches; the limit before a day's "
        "first model call has finished.",
    )
    stall_batch_multiple: float = Field(
        default=StallLimit.batch_multiple,
        gt=0,
        description="The stall limit in multiples of the day's median model call.",
    )
    stall_backstop_grace_seconds: float | None = Field(
        default=None,
        gt=0,
        description="Executor local: seconds past the stall limit before the watchdog's "
        "backstop process kills a step whose interpreter a stuck native call holds (the "
        "step's own watchdog cannot run then); unset, the limit itself and at least "
        "30 s, so the step's own watchdog always acts first while it can.",
    )
    batch_timeout_multiple: float = Field(
        default=BatchTimeout.multiple,
        ge=0,
        description="Per-call deadline: a model call running longer than this many times its "
        "shard's median call is stopped, tried once more, then split in halves before the "
        "shard fails; 0 (the default) turns deadlines off. A spec may set its own "
        "(Sizes.batch_timeout_multiple).",
    )
    batch_timeout_floor_seconds: float = Field(
        default=BatchTimeout.floor, gt=0, description="The least per-call deadline."
    )
    straggler_multiple: float = Field(
        default=3.0,
        ge=0,
        description="Executor ray: once every other shard of a day is done, the one left "
        "gets a second copy on an idle worker after this many times the day's median shard, "
        "and the first to finish is recorded; a stalled worker is replaced and its shard "
        "handed out again once before the step fails. 0 turns both off.",
    )
    progress_line: bool = Field(
        default=False,
        description="Writes each scoring day's progress (rows of rows, rows/s, time left) to "
        "stderr: one line rewritten in place on a terminal, else a line a minute. "
        "`nightshift run` turns it on.",
    )
    progress_fd: int = Field(
        default=2,
        ge=1,
        description="The file descriptor the progress line goes to: stderr, unless "
        "`nightshift run` passes a copy of its terminal's (Dagster's log capture redirects "
        "stderr itself while a step runs).",
    )
    price_spot_per_hour: float | None = Field(
        default=None,
        description="USD per node-hour on spot capacity; unset, the price table's for "
        "NIGHTSHIFT_NODE_TYPE (policy/prices.json).",
    )
    price_on_demand_per_hour: float | None = Field(
        default=None, description="USD per node-hour on on-demand capacity."
    )
    on_demand_after: int = Field(
        default=2, description="After this many interruptions, retry on on-demand capacity."
    )
    executor: Literal["local", "ray"] = Field(
        default="local",
        description="Where a partition's shards run: local (this process, the default) or "
        "ray (Ray actors; the step keeps progress, lease and commit). See deploy/ray/.",
    )
    ray_address: str = Field(
        default="",
        description="With executor ray: empty starts a local Ray for the step and stops it "
        "after; 'auto' joins the cluster of this node; 'ray://head:10001' connects a client.",
    )
    ray_workers: int = Field(default=2, ge=1, description="Ray actors computing shards.")
    ray_cpus_per_worker: float = Field(default=1.0, gt=0, description="CPUs each actor holds.")
    ray_gpus_per_worker: float = Field(
        default=0.0, ge=0, description="GPUs each actor holds (1 on GPU workers)."
    )
    metrics_pushgateway: str | None = Field(
        default=None,
        description="Prometheus Pushgateway URL (http://host:9091) each scored day's metrics "
        "are pushed to, one group per job, asset and partition (docs/monitoring.md); unset, "
        "nothing is pushed.",
    )
    metrics_push_seconds: float = Field(
        default=30.0, gt=0, description="Least seconds between two pushes of a running day."
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Serve the run's metrics at http://127.0.0.1:PORT/metrics while it runs; "
        "unset, no server.",
    )
    metrics_job: str = Field(
        default=DEFAULT_JOB, description="The job label of the Pushgateway groups."
    )

    _runtime: Runtime | None = PrivateAttr(default=None)
    _models: dict[str, Any] = PrivateAttr(default_factory=dict)
    _loads: dict[str, int] = PrivateAttr(default_factory=dict)
    _progress: TextIO | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        # Cheap on purpose: `dagster job execute` initialises resources a second time in the
        # parent process after the run, so models are loaded on first use, not here.
        self._models = {}
        self._loads = {}

    @property
    def runtime(self) -> Runtime:
        """Where this process runs models. With executor ``ray`` the step only drives (the
        workers score, on ``device``), so it reads its model's settings on the CPU: a driver
        node needs no GPU."""
        if self._runtime is None:
            device = "cpu" if self.executor == "ray" else self.device
            self._runtime = make_runtime(device, self.precision)
            if self._runtime.device.type == "cpu":
                configure_cpu_threads(self.cpu_threads)
        return self._runtime

    @property
    def batch_tokens(self) -> int:
        """The text models' padded-token budget per call: the configured one, else sized to
        the device. On a CPU bigger calls only pad more and run slower; a GPU wants the larger
        calls (docs/benchmarks.md, "Text batch budget")."""
        if self.max_batch_tokens is not None:
            return self.max_batch_tokens
        return CPU_BATCH_TOKENS if self.runtime.device.type == "cpu" else GPU_BATCH_TOKENS

    def node_prices(self) -> NodePrices:
        """What the cost ledger prices node time at: the node type's shipped prices
        (``NIGHTSHIFT_NODE_TYPE``, default g5.xlarge), each one configured here overriding
        its own, then ``NIGHTSHIFT_PRICE_*`` (policy/prices.py)."""
        prices = node_prices_from_env()
        if self.price_spot_per_hour is None and self.price_on_demand_per_hour is None:
            return prices
        return NodePrices(
            prices.node_type,
            _given(self.price_spot_per_hour, prices.spot_per_hour),
            _given(self.price_on_demand_per_hour, prices.on_demand_per_hour),
            f"{prices.source}; set on the inference resource",
        )

    def stall_limit(self) -> StallLimit:
        """How long a day may go without a model call finishing (inference/engine/watchdog.py)."""
        return StallLimit(
            self.stall_seconds,
            self.stall_floor_seconds,
            self.stall_ceiling_seconds,
            self.stall_batch_multiple,
            self.stall_backstop_grace_seconds,
        )

    def batch_timeout(self) -> BatchTimeout:
        """How long one model call may run (inference/engine/batch_timeout.py)."""
        return BatchTimeout(self.batch_timeout_multiple, self.batch_timeout_floor_seconds)

    def progress_stream(self) -> TextIO | None:
        """Where each day's progress line goes; None when the line is off."""
        if not self.progress_line:
            return None
        if self._progress is None:  # one for the run's days, the descriptor left open
            self._progress = open(self.progress_fd, "w", buffering=1, closefd=False)  # noqa: SIM115
        return self._progress

    def watcher(self, on_advisory: Callable[[str], None] | None = None) -> InterruptionWatcher:
        """Watches for SIGTERM/SIGINT and, if configured, the cloud's interruption notices."""
        source = notice_source(self.spot_notice, self.spot_endpoint)
        if on_advisory is not None and hasattr(source, "on_advisory"):
            source.on_advisory = on_advisory
        return InterruptionWatcher(source, self.notice_poll_seconds)

    def run_metrics(self, warn: Callable[[str], None]) -> RunMetrics:
        """The run's Prometheus metrics (resources/run_metrics.py): inert unless a
        Pushgateway or a port is configured; ``warn`` is told of a push that failed."""
        settings = MetricsSettings(
            self.metrics_pushgateway, self.metrics_push_seconds, self.metrics_port, self.metrics_job
        )
        return RunMetrics(settings, warn)

    def model(self, key: str, loader: Callable[[Runtime], T]) -> T:
        """Returns the model cached under ``key``, loading it on first use in this process.

        A single-run backfill of many partitions therefore loads each model once.
        """
        if key not in self._models:
            self._models[key] = loader(self.runtime)
            self._loads[key] = self._loads.get(key, 0) + 1
        return self._models[key]

    def load_count(self, key: str) -> int:
        """How many times the model under ``key`` was loaded in this process."""
        return self._loads.get(key, 0)


def _given(configured: float | None, otherwise: float) -> float:
    return otherwise if configured is None else configured
