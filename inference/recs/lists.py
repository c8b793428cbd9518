"""What a user's recommendation list must hold: the catalogue items a user has not seen yet,
the users left with none (quarantined, never silently missing from the output), and exact
figures of the published lists as they stream out of the model.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from inference.engine.invariants import StreamStats
from inference.engine.quarantine import QuarantinePlan, Screener


def eligible_items(
    users: np.ndarray, seen: tuple[np.ndarray, np.ndarray], catalogue: int, known: np.ndarray
) -> np.ndarray:
    """Per user (sorted ``users``), catalogue items they have not interacted with yet.

    Args:
        users: the day's active users, sorted and unique.
        seen: (user_ids, item_ids) of their history.
        catalogue: items in the model's catalogue.
        known: for each seen pair, whether its item is in the catalogue.
    """
    rows = np.searchsorted(users, seen[0][known])
    items = seen[1][known]
    if not len(items):
        return np.full(len(users), catalogue, np.int64)
    _, codes = np.unique(items, return_inverse=True)
    distinct = np.unique(rows.astype(np.int64) * (int(codes.max()) + 1) + codes)
    seen_per_user = np.bincount(distinct // (int(codes.max()) + 1), minlength=len(users))
    return catalogue - seen_per_user


def user_plan(users: np.ndarray, eligible: np.ndarray) -> QuarantinePlan:
    """Quarantines users with no unseen item left to recommend."""
    screener = Screener()
    screener.add(len(users), {"no_unseen_items": eligible <= 0})
    return screener.plan()


def list_observer(users: np.ndarray, eligible: np.ndarray, k: int):
    """Exact statistics of ``user_recommendations`` blocks: each user must get exactly
    ``min(k, eligible items)`` rows."""

    def observe(scored: pa.RecordBatch, out: pa.Table, stats: StreamStats) -> None:
        listed, rows = np.unique(out["user_id"].to_numpy(), return_counts=True)
        expected = np.minimum(k, eligible[np.searchsorted(users, listed)])
        stats.count("users_with_wrong_count", int((rows != expected).sum()))
        stats.count("users_short_of_k", int((rows < k).sum()))
        asked = scored["user_id"].to_numpy()
        stats.count("users_not_asked", int((~np.isin(listed, asked)).sum()))
        stats.count("item_id_null", out["item_id"].null_count)
        ranks = out["rank"].to_numpy()
        stats.extremes("rank", ranks.astype(np.float64))

    return observe
