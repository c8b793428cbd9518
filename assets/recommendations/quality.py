"""Recommendations data quality as plain functions: the landed interactions' figures, which
users cannot be given recommendations, and exact figures of the published lists.

Interactions are history, not rows to score: one with a null id cannot be attributed to anyone,
so it fails the day naming the file and column rather than being set aside. The rows scored
are the day's active users; a user who has already interacted with every item in the catalogue
has nothing left to recommend and is quarantined (``no_unseen_items``) instead of vanishing
from the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from assets.recommendations.schemas import EVENT_TYPES, INTERACTIONS, INTERACTIONS_SCHEMA
from inference.invariants import StreamStats
from inference.quarantine import QuarantinePlan, Screener, below, not_finite, outside
from resources.quality import sample_positions
from resources.storage import DataStore, LandingDataError


@dataclass
class InteractionScreen:
    """What the screening pass found in one day of interactions."""

    plan: QuarantinePlan
    figures: dict[str, Any]
    sample: pa.Table


def screen_interactions(
    store: DataStore, date: str, sample_rows: int = 0, seed: int = 0
) -> InteractionScreen:
    """Counts what is wrong with one day of interactions and samples its rows.

    Raises:
        LandingDataError: the partition is missing, unreadable, malformed or empty, or a row
            has no user or item id (naming the file and the column).
    """
    start = datetime.fromisoformat(date).replace(tzinfo=UTC)
    kind = INTERACTIONS_SCHEMA.field("ts").type
    day = pa.scalar(start, kind), pa.scalar(start + timedelta(days=1), kind)
    rows = store.count_landing(INTERACTIONS, date, INTERACTIONS_SCHEMA)
    if rows == 0:
        where = store.uri(store.landing_path(INTERACTIONS, date))
        raise LandingDataError(
            f"landing partition empty: dataset '{INTERACTIONS}', date {date}: no rows under {where}"
        )
    wanted = sample_positions(rows, sample_rows, seed)
    events = pa.array(EVENT_TYPES, pa.string())
    # Nothing is quarantined here: the screener only counts, by reason, for the checks.
    screener, sampled = Screener(), []
    for file, batch in store.iter_landing_files(INTERACTIONS, date, INTERACTIONS_SCHEMA):
        for column in ("user_id", "item_id"):
            if batch[column].null_count:
                raise LandingDataError(
                    f"{store.uri(file)} (dataset '{INTERACTIONS}', date {date}): column "
                    f"'{column}' has {batch[column].null_count} null values; an interaction "
                    "without it cannot be attributed"
                )
        offset = screener.rows
        weight = batch["weight"]
        screener.add(
            batch.num_rows,
            {
                "unknown_event": pc.fill_null(
                    pc.invert(pc.is_in(batch["event"], value_set=events)), True
                ).to_numpy(zero_copy_only=False),
                "non_finite_weight": not_finite(weight) | _nulls(weight),
                "negative_weight": below(weight, 0.0),
                "ts_outside_day": outside(batch["ts"], *day) | _nulls(batch["ts"]),
            },
        )
        local = wanted[(wanted >= offset) & (wanted < offset + batch.num_rows)] - offset
        if len(local):
            sampled.append(batch.take(pa.array(local)))
    plan = screener.plan()
    figures = {
        "rows": rows,
        **dict.fromkeys(("unknown_event", "non_finite_weight", "negative_weight"), 0),
        "ts_outside_day": 0,
        **plan.counts(),
    }
    sample = pa.Table.from_batches(sampled, schema=INTERACTIONS_SCHEMA)
    # The checks only warn about these rows; they are history, not rows to quarantine.
    return InteractionScreen(QuarantinePlan.empty(rows), figures, sample)


def _nulls(values: pa.Array) -> np.ndarray:
    return pc.is_null(values).to_numpy(zero_copy_only=False)


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


def users_answered(out: pa.Table) -> int:
    """Input rows (users) a recommendations block answers for."""
    return int(pc.count_distinct(out["user_id"]).as_py()) if out.num_rows else 0
