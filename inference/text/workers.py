"""Text models on shard workers: their model calls sized for the worker's device, their figures
returned through each shard's statistics.

Under the ``ray`` executor the step only drives: its runtime is the CPU (resources/inference.py),
so neither its model nor its token budget is a worker's. A worker loads the model itself (the
domain's predictor, once per process or Ray actor, whatever the number of shards), and what the
local engine counts on the driver while the model runs (model calls, the token budget's
out-of-memory back-offs) goes into the shard's statistics, which the driver sums over the
partition's shards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from inference.engine.adaptive import AdaptiveBatchSize
from inference.engine.invariants import StreamStats
from inference.engine.metrics import BatchMetrics

if TYPE_CHECKING:
    import torch

# Default padded tokens per text-model call, on a CPU and on a GPU: on a CPU bigger calls only
# pad more and run slower; a GPU wants the larger calls (docs/benchmarks.md, "Text batch budget").
CPU_BATCH_TOKENS = 2_048
GPU_BATCH_TOKENS = 16_384
# Shard statistics of the model itself, apart from the output observers' counts.
PREFIX = "model."


@dataclass
class ModelMetrics(BatchMetrics):
    """Batch metrics plus the model calls (length buckets) behind them."""

    model_calls: int = 0


def worker_batch_tokens(configured: int | None, device: torch.device) -> int:
    """Padded tokens per model call on a worker: the configured budget, else sized to the
    worker's device as ``InferenceResource.batch_tokens`` sizes it to the step's."""
    if configured is not None:
        return configured
    return CPU_BATCH_TOKENS if device.type == "cpu" else GPU_BATCH_TOKENS


class ShardFigures:
    """One shard's model figures, moved into its statistics after each model call."""

    def __init__(self, metrics: ModelMetrics, sizing: Callable[[], AdaptiveBatchSize], name: str):
        self.metrics, self.sizing, self.name = metrics, sizing, name
        # The sizing lives as long as the model (across shards): count this shard's changes.
        start = sizing()
        self._ooms, self._grows = start.ooms, start.grows

    def record(self, stats: StreamStats) -> None:
        stats.count(f"{PREFIX}calls", self.metrics.model_calls)
        self.metrics.model_calls = 0
        now = self.sizing()
        stats.count(f"{PREFIX}oom_backoffs", now.ooms - self._ooms)
        stats.count(f"{PREFIX}{self.name}_grows", now.grows - self._grows)
        self._ooms, self._grows = now.ooms, now.grows
        stats.extremes(f"{PREFIX}{self.name}", np.array([now.size], np.float64))


def worker_metadata(stats: StreamStats, name: str) -> dict[str, int]:
    """A partition's model figures from its shards' statistics, named as the local engine names
    them: model calls, the smallest budget a worker was left at, back-offs and grows."""
    figures = {"model_calls": stats.counts.get(f"{PREFIX}calls", 0)}
    if f"{PREFIX}{name}" in stats.minima:
        figures[name] = int(stats.minima[f"{PREFIX}{name}"])
    figures["oom_backoffs"] = stats.counts.get(f"{PREFIX}oom_backoffs", 0)
    figures[f"{name}_grows"] = stats.counts.get(f"{PREFIX}{name}_grows", 0)
    return figures
