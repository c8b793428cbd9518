"""Fraud alerts as plain values: the details a flagged transaction carries out of scoring, and
how many frauds a given number of alerts catches (what the promotion gate compares versions on).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def flagged_details(batch: pa.RecordBatch, scores: pa.Table, schema: pa.Schema) -> pa.Table:
    """The flagged rows of one model call with their landing details: the alerts to be.

    Each of ``schema``'s columns comes from the scores where they have it (score, review flag,
    model version), else from the landing ``batch`` the model call read.
    """
    flagged = scores["flagged"]
    details = pa.Table.from_batches([batch]).filter(flagged)
    scored = scores.filter(flagged)
    return pa.table(
        [scored[name] if name in scores.column_names else details[name] for name in schema.names],
        schema=schema,
    )


def recall_at_alerts(y: np.ndarray, scores: np.ndarray, alerts: int) -> float:
    """The share of frauds among the ``alerts`` highest scores (ties by row order)."""
    top = np.argsort(-scores, kind="stable")[: max(0, alerts)]
    return float(np.count_nonzero(y[top] == 1) / max(1, np.count_nonzero(y == 1)))
