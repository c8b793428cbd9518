"""What a tabular model saw in training, per feature, and what to do with values beyond it.

A model extrapolates badly: an MLP trained on amounts up to a few thousand gave a 1e12 amount a
score of 0.004 and 1e308 a score of 6.5e-38, its lowest scores for its most absurd inputs.
:class:`FeatureRanges` is fitted on the training matrix and saved in the model's manifest:

- each feature's training range (minimum, maximum and a few quantiles, for people to read);
- equal-width bins over the (slightly widened) training range and the training histogram over
  them, the reference for per-feature drift (PSI).

At scoring, :meth:`FeatureRanges.guard` clamps every value to its feature's training range (so
the model only ever sees values it was trained on), counts what it clamped per feature, and
marks for review the rows with a value beyond the range by more than a margin (a tenth of the
range's width: a day's busiest merchant a little busier than training's is no reason to send
its thousand transactions to a person; an amount a hundred times the largest ever seen is). It
also bins the day's values for the drift checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.invariants import StreamStats, population_stability

QUANTILES = (0.0, 0.001, 0.01, 0.5, 0.99, 0.999, 1.0)
DRIFT_BINS = 10
# Beyond the training range by more than this share of its width, a row is marked for review.
REVIEW_MARGIN = 0.1
# Statistics names (see StreamStats) under which a scoring pass records what the guard did.
REVIEW = "needs_review"
CLAMPED_PREFIX = "clamped:"
HISTOGRAM_PREFIX = "feature:"


@dataclass(frozen=True)
class Guarded:
    """One batch's features after the guard: clamped values, rows marked, what was seen."""

    x: np.ndarray
    review: np.ndarray  # bool per row: some feature was beyond its range by more than the margin
    clamped: dict[str, int]  # rows clamped per feature (beyond the range at all)
    histograms: dict[str, np.ndarray]  # counts per drift bin per feature

    def record(self, stats: StreamStats) -> None:
        """Adds this batch's figures to a shard's exact statistics."""
        stats.count(REVIEW, int(self.review.sum()))
        for name, n in self.clamped.items():
            stats.count(f"{CLAMPED_PREFIX}{name}", n)
        for name, counts in self.histograms.items():
            stats.add_histogram(f"{HISTOGRAM_PREFIX}{name}", counts)


@dataclass(frozen=True)
class FeatureRanges:
    """Per-feature training ranges and drift references of one model (JSON in its manifest)."""

    names: list[str]
    low: np.ndarray
    high: np.ndarray
    quantiles: dict[str, list[float]]
    edges: list[np.ndarray]  # bin edges per feature (at most DRIFT_BINS + 1; open bins outside)
    reference: list[list[int]]  # training counts per bin per feature

    @classmethod
    def fit(cls, x: np.ndarray, names: list[str], bins: int = DRIFT_BINS) -> FeatureRanges:
        """Ranges and drift bins of the training matrix ``x`` (rows by ``names``)."""
        if x.ndim != 2 or x.shape[1] != len(names):
            raise ValueError(f"expected {len(names)} feature columns, got shape {x.shape}")
        if not len(x):
            raise ValueError("cannot fit feature ranges on no rows")
        qs = np.quantile(x, QUANTILES, axis=0)
        edges, reference = [], []
        for j in range(x.shape[1]):
            # Equal-width bins over the training range widened by 5% either side, plus one open
            # bin beyond each end. Not quantile edges: many features take a few heavily repeated
            # values (a country's share of the day, a merchant's reach), and an edge placed on
            # such a value (as quantiles place them) flips its whole mass to the next bin when
            # the value moves by a hair from one day to the next: drift where there is none.
            lo, hi = float(x[:, j].min()), float(x[:, j].max())
            pad = 0.05 * (hi - lo)
            inner = np.unique(np.linspace(lo - pad, hi + pad, bins + 1))
            edges.append(inner)
            reference.append(_bin_counts(x[:, j], inner).tolist())
        return cls(
            names=list(names),
            low=qs[0].astype(np.float64),
            high=qs[-1].astype(np.float64),
            quantiles={n: [float(v) for v in qs[:, j]] for j, n in enumerate(names)},
            edges=edges,
            reference=reference,
        )

    def guard(self, x: np.ndarray, margin: float = REVIEW_MARGIN) -> Guarded:
        """Clamps ``x`` to the training ranges and counts what was clamped; marks the rows
        beyond a range by more than ``margin`` of its width."""
        if x.shape[1] != len(self.names):
            raise ValueError(f"expected {len(self.names)} feature columns, got shape {x.shape}")
        beyond = (x < self.low) | (x > self.high)
        slack = margin * (self.high - self.low)
        review = ((x < self.low - slack) | (x > self.high + slack)).any(axis=1)
        clamped = np.clip(x, self.low, self.high).astype(x.dtype, copy=False) if beyond.any() else x
        per_feature = beyond.sum(axis=0)
        return Guarded(
            x=clamped,
            review=review,
            clamped={n: int(per_feature[j]) for j, n in enumerate(self.names) if per_feature[j]},
            # Binned before clamping: drift must see how far the day moved, not the clamp.
            histograms={n: _bin_counts(x[:, j], self.edges[j]) for j, n in enumerate(self.names)},
        )

    def drift(self, stats: StreamStats) -> dict[str, float]:
        """Each feature's population stability index against training, from a day's statistics."""
        psi = {}
        for j, name in enumerate(self.names):
            seen = stats.histograms.get(f"{HISTOGRAM_PREFIX}{name}")
            if seen is not None:
                psi[name] = population_stability(self.reference[j], seen)
        return psi

    def to_json(self) -> dict[str, Any]:
        return {
            "names": self.names,
            "low": self.low.tolist(),
            "high": self.high.tolist(),
            "quantiles": {"levels": list(QUANTILES), **self.quantiles},
            "edges": [e.tolist() for e in self.edges],
            "reference": self.reference,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FeatureRanges:
        quantiles = {k: v for k, v in data["quantiles"].items() if k != "levels"}
        return cls(
            names=list(data["names"]),
            low=np.asarray(data["low"], np.float64),
            high=np.asarray(data["high"], np.float64),
            quantiles=quantiles,
            edges=[np.asarray(e, np.float64) for e in data["edges"]],
            reference=[list(r) for r in data["reference"]],
        )


def _bin_counts(values: np.ndarray, inner_edges: np.ndarray) -> np.ndarray:
    """Counts of ``values`` in the bins cut at ``inner_edges`` (non-finite values excluded)."""
    finite = values[np.isfinite(values)]
    index = np.searchsorted(inner_edges, finite, side="right")
    return np.bincount(index, minlength=len(inner_edges) + 1)
