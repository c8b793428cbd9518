"""Exact statistics of a partition's output, computed as it streams through the engine.

Checks over a million rows cannot afford to re-read and re-validate every row, so each shard
keeps counts, extremes, fixed-bin histograms and small sets of distinct values as its batches
pass; the figures are saved with the shard's checkpoint and merged at commit. Resumed shards
therefore contribute exactly what they contributed when they were first computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A distinct-value set larger than this is not kept (it would no longer be a "small" set).
MAX_DISTINCT = 64


@dataclass
class StreamStats:
    """Mergeable, JSON-serialisable statistics: counts, minima, maxima, histograms, value sets."""

    counts: dict[str, int] = field(default_factory=dict)
    minima: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, list[int]] = field(default_factory=dict)
    values: dict[str, list[str]] = field(default_factory=dict)

    def count(self, name: str, n: int | np.integer) -> None:
        self.counts[name] = self.counts.get(name, 0) + int(n)

    def extremes(self, name: str, values: np.ndarray) -> None:
        """Folds the finite values' minimum and maximum into ``min`` / ``max`` of ``name``."""
        finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
        if not len(finite):
            return
        low, high = float(finite.min()), float(finite.max())
        self.minima[name] = min(self.minima.get(name, low), low)
        self.maxima[name] = max(self.maxima.get(name, high), high)

    def histogram(self, name: str, values: np.ndarray, bins: int, low: float, high: float) -> None:
        """Adds finite values to ``bins`` equal bins over [low, high] (outliers clamp to the ends)."""
        finite = values[np.isfinite(values)]
        index = np.clip(((finite - low) / (high - low) * bins).astype(np.int64), 0, bins - 1)
        counts = np.bincount(index, minlength=bins)
        current = self.histograms.get(name, [0] * bins)
        self.histograms[name] = [a + int(b) for a, b in zip(current, counts, strict=True)]

    def add_histogram(self, name: str, counts: np.ndarray | list[int]) -> None:
        """Adds counts already binned by the caller (bins of its own choosing) to ``name``."""
        current = self.histograms.get(name, [0] * len(counts))
        self.histograms[name] = [a + int(b) for a, b in zip(current, counts, strict=True)]

    def distinct(self, name: str, values: list[str | None] | set[str | None]) -> None:
        kept = set(self.values.get(name, [])) | {str(v) for v in values}
        self.values[name] = sorted(kept)[: MAX_DISTINCT + 1]

    def merge(self, other: StreamStats) -> StreamStats:
        for name, n in other.counts.items():
            self.count(name, n)
        for name, v in other.minima.items():
            self.minima[name] = min(self.minima.get(name, v), v)
        for name, v in other.maxima.items():
            self.maxima[name] = max(self.maxima.get(name, v), v)
        for name, hist in other.histograms.items():
            current = self.histograms.get(name, [0] * len(hist))
            self.histograms[name] = [a + b for a, b in zip(current, hist, strict=True)]
        for name, vals in other.values.items():
            self.distinct(name, vals)
        return self

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "minima": self.minima,
            "maxima": self.maxima,
            "histograms": self.histograms,
            "values": self.values,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> StreamStats:
        data = data or {}
        return cls(
            counts=dict(data.get("counts", {})),
            minima=dict(data.get("minima", {})),
            maxima=dict(data.get("maxima", {})),
            histograms={k: list(v) for k, v in data.get("histograms", {}).items()},
            values={k: list(v) for k, v in data.get("values", {}).items()},
        )


def population_stability(expected: list[int] | np.ndarray, actual: list[int] | np.ndarray) -> float:
    """Population stability index between two histograms over the same bins.

    Below 0.1 is usually read as no shift, 0.1-0.25 as a moderate one, above 0.25 as a large one.
    Empty bins get a small floor so that a bin seen on one side only counts, but finitely.
    """
    e = np.asarray(expected, np.float64)
    a = np.asarray(actual, np.float64)
    if e.sum() == 0 or a.sum() == 0:
        return 0.0
    e = np.maximum(e / e.sum(), 1e-4)
    a = np.maximum(a / a.sum(), 1e-4)
    return float(np.sum((a - e) * np.log(a / e)))
