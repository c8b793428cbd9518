"""Exact figures of fraud scores as they stream out of the model, read by the output checks,
and the fixed histogram bins the scores and the training reference share (with the training
rows that reference is scored on).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inference.engine.invariants import StreamStats

SCORE_BINS = 20


def score_observer(threshold: float, version: str):
    """Exact statistics of ``fraud_scores`` batches, for the output checks.

    Counts scores that are null, not finite or outside [0, 1], flags that disagree with the
    threshold, missing model versions, and rows whose transaction_id is not the id of the input
    row they scored (so the output ids are exactly the screened, duplicate-free input ids).
    """
    cut = np.float32(threshold)

    def observe(scored: pa.RecordBatch, out: pa.Table, stats: StreamStats) -> None:
        score = out["score"]
        values = score.to_numpy(zero_copy_only=False).astype(np.float64)
        finite = np.isfinite(values)
        stats.count("score_null", score.null_count)
        stats.count("score_not_finite", int((~finite).sum()) - score.null_count)
        stats.count("score_outside_unit_interval", int(((values < 0) | (values > 1)).sum()))
        stats.extremes("score", values)
        stats.histogram("score", values, SCORE_BINS, 0.0, 1.0)
        flagged = out["flagged"].to_numpy(zero_copy_only=False)
        stats.count("flagged", int(flagged.sum()))
        expected = values.astype(np.float32) >= cut
        stats.count("flag_mismatch", int((flagged != expected).sum()))
        versions = out["model_version"]
        wrong = pc.fill_null(pc.not_equal(versions, version), True)
        stats.count("model_version_missing", int(pc.sum(wrong).as_py() or 0))
        ids = out["transaction_id"]
        same = ids.equals(pa.chunked_array([scored["transaction_id"]]))
        stats.count("ids_not_passed_through", 0 if same else _mismatches(ids, scored))
        stats.count("transaction_id_null", ids.null_count)

    return observe


def _mismatches(ids: pa.ChunkedArray, scored: pa.RecordBatch) -> int:
    if len(ids) != scored.num_rows:
        return max(len(ids), scored.num_rows)
    differs = pc.fill_null(pc.not_equal(ids, scored["transaction_id"]), True)
    return int(pc.sum(differs).as_py() or 0)


def score_histogram(scores: np.ndarray) -> list[int]:
    """Scores in the fixed bins the output statistics use (the training reference)."""
    stats = StreamStats()
    stats.histogram("score", np.asarray(scores, np.float64), SCORE_BINS, 0.0, 1.0)
    return stats.histograms["score"]


# Enough training rows for a 20-bin reference histogram to be exact to a fraction of a percent.
REFERENCE_ROWS = 200_000


def reference_rows(x: np.ndarray, seed: int) -> np.ndarray:
    """The training rows whose scores make the reference histogram: all of them, or a seeded
    sample of :data:`REFERENCE_ROWS` in their order."""
    if len(x) <= REFERENCE_ROWS:
        return x
    return x[np.sort(np.random.default_rng(seed).choice(len(x), REFERENCE_ROWS, replace=False))]
