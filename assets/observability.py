"""What the UI shows about one scoring partition: throughput, latency, batch sizes, where the time
went, the prefetch queue, the device, GPU use, and what the run cost.

Pure functions of a finished `BatchMetrics`: numbers (which the UI plots over partitions and
time), a markdown summary, and tables. `GpuMonitor` reads torch.cuda while a partition runs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

from inference.engine.metrics import PHASES, BatchMetrics, NodePrice

SLOWEST_BATCHES = 5
HISTOGRAM_BINS = 8


@dataclass(frozen=True)
class GpuStats:
    """GPU use over a partition: mean utilisation (None where NVML is unavailable) and peak
    memory allocated by torch."""

    utilisation_pct: float | None
    peak_memory_gib: float


def observability_metadata(
    metrics: BatchMetrics,
    *,
    device: str,
    price: NodePrice | None = None,
    capacity: str = "spot",
    gpu: GpuStats | None = None,
    run_seconds: float | None = None,
    slowest: int = SLOWEST_BATCHES,
) -> dict[str, Any]:
    """The materialisation metadata of one scoring partition (or a range, from merged metrics).

    Args:
        metrics: the finished metrics of the partition.
        device: where it ran, as the runtime describes itself (e.g. ``cuda:0 (bf16)``).
        price: node prices; without them no cost is shown.
        capacity: ``spot`` or ``on_demand``, the capacity the run actually used.
        gpu: from `GpuMonitor.stats()` when on CUDA; None on CPU.
        run_seconds: node time to charge; default the partition's wall time.
        slowest: how many of the slowest batches to list.

    Returns:
        Numbers the UI plots (rows/s, tokens/s, latency and time-to-first-token percentiles,
        phase seconds, queue depth, cost), a markdown ``summary``, and tables of batch sizes
        and of the slowest batches.
    """
    metadata: dict[str, Any] = {
        **metrics.as_dict(),
        **metrics.latency_percentiles(),
        **metrics.first_token_percentiles(),  # generation days only
    }
    metadata["device"] = device
    metadata.update(phase_metadata(metrics))
    metadata.update(queue_metadata(metrics.queue_depths))
    if metrics.batch_sizes:
        metadata["batch_size_histogram"] = batch_size_histogram(metrics.batch_sizes)
        metadata["slowest_batches"] = slowest_batches(metrics, slowest)
    if gpu is not None:
        metadata["gpu_peak_memory_gib"] = round(gpu.peak_memory_gib, 3)
        if gpu.utilisation_pct is not None:
            metadata["gpu_utilisation_pct"] = round(gpu.utilisation_pct, 1)
    cost = cost_metadata(
        run_seconds if run_seconds is not None else metrics.seconds, price, capacity
    )
    metadata.update(cost)
    metadata["summary"] = MetadataValue.md(summary_markdown(metrics, device, gpu, cost))
    return metadata


def phase_metadata(metrics: BatchMetrics) -> dict[str, float]:
    """Seconds spent reading, preprocessing, computing and writing, and each one's share of the
    partition's wall time (the remainder is waiting: model load, queue stalls, bookkeeping)."""
    wall = metrics.seconds
    out: dict[str, float] = {}
    for phase in PHASES:
        seconds = metrics.phase_seconds.get(phase, 0.0)
        out[f"{phase}_seconds"] = round(seconds, 4)
        out[f"{phase}_pct"] = round(100 * seconds / wall, 1) if wall > 0 else 0.0
    return out


def queue_metadata(depths: Sequence[int]) -> dict[str, float | int]:
    """Prefetch queue depth: a mean near zero means the model waited on reads (IO-bound)."""
    if not depths:
        return {}
    values = np.asarray(depths)
    return {
        "queue_depth_mean": round(float(values.mean()), 2),
        "queue_depth_min": int(values.min()),
        "queue_depth_max": int(values.max()),
        "queue_empty_pct": round(100 * float((values == 0).mean()), 1),
    }


def cost_metadata(seconds: float, price: NodePrice | None, capacity: str) -> dict[str, float]:
    """Estimated cost of the node time: price per node-hour times hours, on the capacity used,
    with what on-demand would have cost and the saving of spot over it."""
    if price is None:
        return {}
    if capacity not in ("spot", "on_demand"):
        raise ValueError(f"capacity must be 'spot' or 'on_demand', not {capacity!r}")
    hours = seconds / 3600
    spot, on_demand = price.spot_per_hour * hours, price.on_demand_per_hour * hours
    saving = on_demand - spot
    return {
        "cost_usd": round(spot if capacity == "spot" else on_demand, 6),
        "cost_spot_usd": round(spot, 6),
        "cost_on_demand_usd": round(on_demand, 6),
        "spot_saving_usd": round(saving, 6),
        "spot_saving_pct": round(100 * saving / on_demand, 1) if on_demand > 0 else 0.0,
    }


def batch_size_histogram(sizes: Sequence[int], bins: int = HISTOGRAM_BINS) -> MetadataValue:
    """How many batches fell in each size range: a table (the UI renders it as rows)."""
    values = np.asarray(sizes)
    low, high = int(values.min()), int(values.max())
    edges = np.unique(np.linspace(low, high + 1, num=min(bins, high - low + 1) + 1).astype(int))
    counts, _ = np.histogram(values, bins=edges)
    records = [
        TableRecord({"batch_size": f"{lo}-{hi - 1}" if hi - 1 > lo else str(lo), "batches": int(n)})
        for lo, hi, n in zip(edges[:-1], edges[1:], counts, strict=True)
        if n
    ]
    schema = TableSchema(
        columns=[TableColumn("batch_size", "string"), TableColumn("batches", "int")]
    )
    return MetadataValue.table(records=records, schema=schema)


def slowest_batches(metrics: BatchMetrics, count: int = SLOWEST_BATCHES) -> MetadataValue:
    """The slowest model calls: which batch (in order of the run), its rows, time and rows/s."""
    order = np.argsort(np.asarray(metrics.batch_seconds))[::-1][:count]
    records = []
    for i in order:
        seconds, rows = metrics.batch_seconds[i], metrics.batch_sizes[i]
        records.append(
            TableRecord(
                {
                    "batch": int(i),
                    "rows": int(rows),
                    "ms": round(1000 * seconds, 3),
                    "rows_per_second": round(rows / seconds, 1) if seconds > 0 else 0.0,
                }
            )
        )
    schema = TableSchema(
        columns=[
            TableColumn("batch", "int"),
            TableColumn("rows", "int"),
            TableColumn("ms", "float"),
            TableColumn("rows_per_second", "float"),
        ]
    )
    return MetadataValue.table(records=records, schema=schema)


def summary_markdown(
    metrics: BatchMetrics, device: str, gpu: GpuStats | None, cost: dict[str, float]
) -> str:
    """A few lines a person reads first: how much, how fast, where the time went, what it cost."""
    lines = [
        f"**{metrics.rows_in:,} rows** in {metrics.seconds:.2f} s "
        f"(**{metrics.rows_per_second:,.0f} rows/s**) on `{device}`"
    ]
    if metrics.tokens and metrics.seconds > 0:
        lines.append(
            f"{metrics.tokens:,} tokens ({metrics.tokens / metrics.seconds:,.0f} tokens/s)"
        )
    latency = metrics.latency_percentiles()
    if latency:
        p50, p95, p99 = latency.values()
        lines.append(
            f"{metrics.batches} batches of {metrics.mean_batch_size:,.0f} rows on average; "
            f"latency p50 {p50:.1f} ms, p95 {p95:.1f} ms, p99 {p99:.1f} ms"
        )
    split = phase_metadata(metrics)
    if any(split[f"{p}_seconds"] for p in PHASES):
        lines.append("time: " + ", ".join(f"{p} {split[f'{p}_pct']:.0f}%" for p in PHASES))
    if gpu is not None:
        use = f"{gpu.utilisation_pct:.0f}% busy, " if gpu.utilisation_pct is not None else ""
        lines.append(f"GPU: {use}peak memory {gpu.peak_memory_gib:.2f} GiB")
    if cost:
        lines.append(
            f"cost ${cost['cost_usd']:.4f} (spot ${cost['cost_spot_usd']:.4f}, on-demand "
            f"${cost['cost_on_demand_usd']:.4f}: spot saves {cost['spot_saving_pct']:.0f}%)"
        )
    return "\n\n".join(lines)


class GpuMonitor:
    """Samples GPU utilisation in a background thread and reads torch's peak memory, while a
    partition runs. On a CPU device it does nothing and `stats()` is None.

    Use as ``with GpuMonitor(device) as gpu: ...`` then ``gpu.stats()``.
    """

    def __init__(self, device: str, interval: float = 0.5) -> None:
        self.device = device
        self.interval = interval
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak_gib: float | None = None
        self._cuda = device.startswith("cuda")

    def __enter__(self) -> GpuMonitor:
        if not self._cuda:
            return self
        import torch

        torch.cuda.reset_peak_memory_stats(self.device)
        if self._utilisation() is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._cuda:
            return
        import torch

        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._peak_gib = torch.cuda.max_memory_allocated(self.device) / 2**30

    def stats(self) -> GpuStats | None:
        if self._peak_gib is None:
            return None
        utilisation = float(np.mean(self._samples)) if self._samples else None
        return GpuStats(utilisation_pct=utilisation, peak_memory_gib=self._peak_gib)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            value = self._utilisation()
            if value is not None:
                self._samples.append(value)

    def _utilisation(self) -> float | None:
        """NVML's percent of time a kernel ran; None where NVML (pynvml) is not installed."""
        import torch

        try:
            return float(torch.cuda.utilization(self.device))
        except Exception:  # noqa: BLE001 - NVML missing or not supported on this device
            return None
