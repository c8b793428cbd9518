"""Scoring-partition observability metadata: throughput, latency, batch sizes, time split, queue, GPU, cost, summary and tables."""

from __future__ import annotations

import pytest
from dagster import MetadataValue

from assets.day_metadata import DETAIL, PLOTTED, day_figures, day_metadata
from assets.observability import (
    GpuMonitor,
    GpuStats,
    NodePrice,
    batch_size_histogram,
    cost_metadata,
    observability_metadata,
    slowest_batches,
)
from inference.engine.metrics import BatchMetrics

PRICE = NodePrice(spot_per_hour=0.36, on_demand_per_hour=1.2)


def _metrics(batch_ms: list[float], sizes: list[int], tokens: int = 0) -> BatchMetrics:
    metrics = BatchMetrics(started=100.0)
    for ms, size in zip(batch_ms, sizes, strict=True):
        metrics.record_batch(size, size, ms / 1000)
    metrics.tokens = tokens
    for phase, seconds in {"read": 1.0, "preprocess": 0.5, "compute": 2.0, "write": 0.5}.items():
        metrics.add_phase(phase, seconds)
    for depth in (2, 2, 1, 0):
        metrics.observe_queue_depth(depth)
    metrics.finished = 105.0  # five seconds of wall time
    return metrics


def test_numbers_the_ui_plots() -> None:
    metrics = _metrics([10, 20, 30, 40, 500], [1000, 1000, 1000, 1000, 600], tokens=9000)
    meta = observability_metadata(metrics, device="cuda:0 (bf16)", price=PRICE)
    assert meta["rows_per_second"] == 4600 / 5
    assert meta["tokens_per_second"] == 9000 / 5
    assert meta["batch_latency_p50_ms"] == 30.0
    assert 40 < meta["batch_latency_p95_ms"] < meta["batch_latency_p99_ms"] <= 500
    assert (meta["read_seconds"], meta["compute_pct"], meta["write_pct"]) == (1.0, 40.0, 10.0)
    assert meta["queue_depth_mean"] == 1.25 and meta["queue_empty_pct"] == 25.0
    assert meta["device"] == "cuda:0 (bf16)"
    # Plain numbers (not strings) are what the UI plots over partitions and time.
    numeric = [k for k, v in meta.items() if isinstance(v, int | float)]
    assert {"rows_per_second", "batch_latency_p99_ms", "cost_usd", "compute_seconds"} <= set(
        numeric
    )


def test_cost_is_price_times_node_hours_with_the_spot_saving() -> None:
    cost = cost_metadata(1800, PRICE, "spot")
    assert cost["cost_usd"] == cost["cost_spot_usd"] == pytest.approx(0.18)
    assert cost["cost_on_demand_usd"] == pytest.approx(0.6)
    assert cost["spot_saving_usd"] == pytest.approx(0.42)
    assert cost["spot_saving_pct"] == 70.0
    assert cost_metadata(1800, PRICE, "on_demand")["cost_usd"] == pytest.approx(0.6)
    assert cost_metadata(1800, None, "spot") == {}
    with pytest.raises(ValueError, match="capacity"):
        cost_metadata(1800, PRICE, "reserved")


def test_run_seconds_override_charges_the_whole_node_time() -> None:
    metrics = _metrics([10], [100])
    meta = observability_metadata(metrics, device="cpu", price=PRICE, run_seconds=3600)
    assert meta["cost_usd"] == pytest.approx(0.36)


def test_slowest_batches_table_lists_the_slowest_first() -> None:
    metrics = _metrics([10, 90, 30, 70], [100, 200, 300, 400])
    table = slowest_batches(metrics, count=2)
    rows = [r.data for r in table.records]
    assert rows == [
        {"batch": 1, "rows": 200, "ms": 90.0, "rows_per_second": pytest.approx(2222.2)},
        {"batch": 3, "rows": 400, "ms": 70.0, "rows_per_second": pytest.approx(5714.3)},
    ]
    assert [c.name for c in table.schema.columns] == ["batch", "rows", "ms", "rows_per_second"]


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ([512] * 4, {"512": 4}),
        ([1024, 1024, 1024, 100], {"100-214": 1, "909-1024": 3}),
    ],
)
def test_batch_size_histogram_counts_every_batch(sizes: list[int], expected: dict) -> None:
    table = batch_size_histogram(sizes)
    counts = {r.data["batch_size"]: r.data["batches"] for r in table.records}
    assert counts == expected
    assert sum(counts.values()) == len(sizes)


def test_summary_is_markdown_with_throughput_latency_gpu_and_cost() -> None:
    metrics = _metrics([10, 20, 30], [1000, 1000, 1000])
    gpu = GpuStats(utilisation_pct=87.5, peak_memory_gib=3.25)
    meta = observability_metadata(metrics, device="cuda:0 (bf16)", price=PRICE, gpu=gpu)
    assert isinstance(meta["summary"], MetadataValue.md("").__class__)
    text = meta["summary"].value
    assert "**3,000 rows**" in text and "600 rows/s" in text
    assert "p50 20.0 ms" in text and "GPU: 88% busy, peak memory 3.25 GiB" in text
    assert "spot saves 70%" in text
    assert (meta["gpu_utilisation_pct"], meta["gpu_peak_memory_gib"]) == (87.5, 3.25)


def test_a_partition_with_no_batches_still_describes_itself() -> None:
    metrics = BatchMetrics(started=0.0)
    metrics.finished = 1.0
    meta = observability_metadata(metrics, device="cpu")
    assert meta["rows_in"] == 0 and "slowest_batches" not in meta and "cost_usd" not in meta
    assert "**0 rows**" in meta["summary"].value


def test_gpu_monitor_is_a_no_op_on_cpu() -> None:
    with GpuMonitor("cpu") as monitor:
        pass
    assert monitor.stats() is None


@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs a CUDA device")
def test_gpu_monitor_reads_peak_memory_on_cuda() -> None:
    import torch

    with GpuMonitor("cuda:0", interval=0.05) as monitor:
        x = torch.randn(4096, 4096, device="cuda:0")
        for _ in range(20):
            x = x @ x.T / 4096
        torch.cuda.synchronize()
    stats = monitor.stats()
    assert stats is not None and stats.peak_memory_gib >= 4096 * 4096 * 4 / 2**30
    if stats.utilisation_pct is not None:
        assert 0 <= stats.utilisation_pct <= 100


def test_a_days_metadata_puts_the_headline_first_and_the_rest_in_one_table() -> None:
    metrics = _metrics([10, 20, 30], [1000, 1000, 1000])
    figures = {
        **observability_metadata(metrics, device="cpu", price=PRICE),
        "dagster/row_count": 3000,
        "output": MetadataValue.path("/out/date=2026-03-01"),
        "model_version": "abc",
        "model_version_changed": 1,
        "interruptions": 0,
        "rows_redone": 0,
        "quarantine_rate": 0.0,
        "commit": "c0ffee",
        "flagged": 7,
    }
    laid_out = day_metadata(figures)
    keys = list(laid_out)
    assert keys[:3] == ["dagster/row_count", "output", "quarantine_rate"]
    assert keys.index(DETAIL) == keys.index("summary") + 1
    plotted = [k for k, v in laid_out.items() if isinstance(v, int | float)]
    assert plotted == [k for k in PLOTTED if k in figures]  # cost_usd with a price
    assert len(plotted) == 8
    # Nothing lost: every scalar figure reads back by name, with its value and type.
    back = day_figures(laid_out)
    for key, value in figures.items():
        expected = getattr(value, "value", value)
        assert back[key] == expected and type(back[key]) is type(expected), key
    assert isinstance(laid_out["slowest_batches"], type(slowest_batches(metrics)))
