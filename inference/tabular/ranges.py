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

from inference.engine.invariants import StreamStats, population_stability

QUANTILES = (0.0, 0.001, 0.01, 0.5, 0.99, 0.999, 1.0)
DRIFT_BINS = 10
# Beyond the training range by more than this share of its width, a row is marked for review.
REVIEW_MARGIN = 0.1
# Every this-many-th row of a batch is binned for drift: a distribution needs thousands of
# values, not millions, and binning every row is a noticeable share of scoring a partition
# end to end; one in four costs a quarter of that.
DRIFT_STRIDE = 4
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
    # Counts per drift bin per feature, over every DRIFT_STRIDE-th row.
    histograms: dict[str, np.ndarray]

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
    edges: list[np.ndarray]  # DRIFT_BINS + 1 equal-width edges per feature; open bins outside
    reference: list[list[int]]  # training counts per bin per feature

    @classmethod
    def fit(cls, x: np.ndarray, names: list[str], bins: int = DRIFT_BINS) -> FeatureRanges:
        """Ranges and drift bins of the training matrix ``x`` (rows by ``names``)."""
        if x.ndim != 2 or x.shape[1] != len(names):
            raise ValueError(f"expected {len(names)} feature columns, got shape {x.shape}")
        if not len(x):
            raise ValueError("cannot fit feature ranges on no rows")
        qs = np.quantile(x, QUANTILES, axis=0)
        edges = []
        for j in range(x.shape[1]):
            # Equal-width bins over the training range widened by 5% either side, plus one open
            # bin beyond each end. Not quantile edges: many features take a few heavily repeated
            # values (a country's share of the day, a merchant's reach), and an edge placed on
            # such a value (as quantiles place them) flips its whole mass to the next bin when
            # the value moves by a hair from one day to the next: drift where there is none.
            lo, hi = float(qs[0, j]), float(qs[-1, j])
            pad = 0.05 * (hi - lo) if hi > lo else 0.5
            edges.append(np.linspace(lo - pad, hi + pad, bins + 1))
        made = cls(
            names=list(names),
            low=qs[0].astype(np.float64),
            high=qs[-1].astype(np.float64),
            quantiles={n: [float(v) for v in qs[:, j]] for j, n in enumerate(names)},
            edges=edges,
            reference=[],
        )
        made.reference.extend(c.tolist() for c in made.bin_counts(x))
        return made

    def guard(self, x: np.ndarray, margin: float = REVIEW_MARGIN) -> Guarded:
        """Clamps ``x`` to the training ranges and counts what was clamped; marks the rows
        beyond a range by more than ``margin`` of its width."""
        if x.shape[1] != len(self.names):
            raise ValueError(f"expected {len(self.names)} feature columns, got shape {x.shape}")
        # Bounds in the matrix's own dtype: comparing float32 features with float64 bounds
        # would upcast every element (this runs on every batch of every partition).
        low, high = self.low.astype(x.dtype), self.high.astype(x.dtype)
        slack = (margin * (self.high - self.low)).astype(x.dtype)
        per_feature = np.zeros(x.shape[1], np.int64)
        review = np.zeros(len(x), bool)
        # Binned before clamping: drift must see how far the day moved, not the clamp.
        counts = self.bin_counts(x[::DRIFT_STRIDE])
        # Feature by feature on a transposed copy: numpy's reductions along the rows of a
        # row-major matrix are slower than the copy and contiguous reductions together, and most
        # features of a batch have nothing to clamp, which their minimum and maximum tell at once.
        columns = np.ascontiguousarray(x.T)
        clamped = x
        for j, column in enumerate(columns):
            if not len(column) or (column.min() >= low[j] and column.max() <= high[j]):
                continue
            if clamped is x:
                clamped = x.copy()
            per_feature[j] = np.count_nonzero((column < low[j]) | (column > high[j]))
            review |= (column < low[j] - slack[j]) | (column > high[j] + slack[j])
            np.clip(column, low[j], high[j], out=clamped[:, j])
        return Guarded(
            x=clamped,
            review=review,
            clamped={n: int(per_feature[j]) for j, n in enumerate(self.names) if per_feature[j]},
            histograms={n: counts[j] for j, n in enumerate(self.names)},
        )

    def bin_counts(self, x: np.ndarray) -> np.ndarray:
        """Counts per drift bin, one row per feature, of the finite values of ``x``.

        The bins are equal-width (see :meth:`fit`), so a value's bin is arithmetic, for the
        whole matrix at once: one subtraction, one multiplication and one bincount.
        """
        bins = np.array([len(e) + 1 for e in self.edges])
        if len(set(bins)) != 1:
            raise ValueError("every feature must have the same number of drift bins")
        width = len(self.edges[0]) + 1
        start = np.array([e[0] for e in self.edges], x.dtype)
        scale = np.array([(len(e) - 1) / (e[-1] - e[0]) for e in self.edges], x.dtype)
        index = np.floor((x - start) * scale)
        np.clip(index + 1, 0, width - 1, out=index)
        index += np.arange(x.shape[1], dtype=x.dtype) * width  # each feature its own bins
        flat = index.astype(np.intp)
        finite = np.isfinite(x)
        if not finite.all():
            flat[~finite] = x.shape[1] * width  # one spill bin, dropped below
        counts = np.bincount(flat.ravel(), minlength=x.shape[1] * width + 1)
        return counts[: x.shape[1] * width].reshape(x.shape[1], width)

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
