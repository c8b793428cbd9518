"""``user_recommendations`` in shards of users, each carrying their history.

A user's list depends on every item they ever interacted with (those are never recommended),
over every landed day up to the scored one. The driver reads that history once (the quarantine
plan needs it anyway) and cuts the sorted audience into row ranges of ``shard_rows`` users; each
shard's rows carry their users' seen items as a list column, so a shard needs only its rows and
the model (:func:`user_cut`, :func:`shard_lists`).

Users with nothing left to recommend (quarantined, ``no_unseen_items``) need no history: they
travel in shards of their own after the ranges, as ``user_id`` alone, with their quarantined rows.

The ranking's own figures (users ranked by popularity, users short of k, out-of-memory
back-offs) are recorded into each shard's statistics, so they come back with the shard and the
driver sums them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inference.engine.invariants import StreamStats
from inference.engine.predictor import ShardCut
from inference.engine.shard_worker import Observe, ShardInput
from inference.recs.lists import eligible_items, list_observer, user_plan
from inference.recs.recommend import RecommendationBatch, recommend
from inference.recs.sparse import Vocabulary

SEEN = "seen_items"
# Shard statistics of the ranking itself, apart from the list observer's own counts.
RANKING_PREFIX = "ranking."
RANKING_COUNTS = ("popularity_ranked_users", "users_short_of_k", "oom_backoffs")

Seen = tuple[np.ndarray, np.ndarray]  # (user_ids, item_ids), sorted by user


def rank_block(
    recommender,
    seen: Seen,
    block_users: np.ndarray,
    k: int,
    block: int,
    version: str,
    schema: pa.Schema,
    counts: Counter,
) -> pa.Table:
    """The lists of one model call's users (sorted), adding to ``counts`` as it ranks."""
    if not len(block_users):
        return schema.empty_table()
    seen_users, seen_items = seen
    lo = np.searchsorted(seen_users, block_users[0], "left")
    hi = np.searchsorted(seen_users, block_users[-1], "right")
    mine = (seen_users[lo:hi], seen_items[lo:hi])
    blocks = recommend(recommender, block_users, mine, k, block)
    return pa.Table.from_batches(list(record_batches(blocks, version, schema, counts)), schema)


def record_batches(
    batches: Iterator[RecommendationBatch], version: str, schema: pa.Schema, counts: Counter
) -> Iterator[pa.RecordBatch]:
    """Each block's lists as rows of ``schema`` (user_id, rank, item_id, score,
    model_version), adding its ranking figures to ``counts``."""
    for b in batches:
        counts["users_short_of_k"] += b.users_short_of_k
        if b.cold_start:
            counts["popularity_ranked_users"] += b.users
        yield pa.record_batch(
            [
                pa.array(b.user_ids, pa.int64()),
                pa.array(b.ranks.astype(np.int16)),
                pa.array(b.item_ids, pa.int64()),
                pa.array(b.scores.astype(np.float32)),
                pa.array(np.full(len(b.user_ids), version, dtype=object), pa.string()),
            ],
            schema=schema,
        )


def user_shards(
    users: np.ndarray, seen: Seen, held: np.ndarray, shard_rows: int
) -> Iterator[ShardInput]:
    """The audience (sorted) in ranges of ``shard_rows`` users with their seen items, then
    the ``held`` (quarantined) users in shards of their own without history.

    A user's position is its place in ``users``, the partition's input order.
    """
    size = shard_rows or max(1, len(users))
    index = 0
    for start in range(0, len(users), size):
        positions = np.arange(start, min(start + size, len(users)), dtype=np.int64)
        positions = positions[~held[positions]]
        yield ShardInput(index, _with_history(users[positions], seen), positions)
        index += 1
    apart = np.flatnonzero(held).astype(np.int64)
    for start in range(0, len(apart), size):
        positions = apart[start : start + size]
        rows = pa.table({"user_id": pa.array(users[positions], pa.int64())})
        yield ShardInput(index, rows, positions)
        index += 1


def shard_counts(users: int, held: int, shard_rows: int) -> dict[str, int]:
    """How many shards :func:`user_shards` cuts: ranges of users, and shards of held users."""
    size = shard_rows or max(1, users)
    return {"user_shards": -(-users // size), "held_user_shards": -(-held // size)}


def _with_history(users: np.ndarray, seen: Seen) -> pa.Table:
    """``user_id`` and each user's seen items, in the order the history holds them."""
    seen_users, seen_items = seen
    starts = np.searchsorted(seen_users, users, "left")
    lengths = np.searchsorted(seen_users, users, "right") - starts
    offsets = np.zeros(len(users) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    within = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    items = seen_items[np.repeat(starts, lengths) + within]
    lists = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(items, pa.int64()))
    return pa.table({"user_id": pa.array(users, pa.int64()), SEEN: lists})


def _shard_seen(rows: pa.Table) -> Seen:
    users = rows["user_id"].to_numpy()
    lists = rows[SEEN].combine_chunks()
    lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
    items = lists.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return np.repeat(users, lengths), items


def ranking_counts(stats: StreamStats) -> dict[str, int]:
    """The ranking figures of a partition's shards, summed by the driver."""
    return {name: stats.counts.get(f"{RANKING_PREFIX}{name}", 0) for name in RANKING_COUNTS}


def catalogue_history(seen: Seen, catalogue: Vocabulary) -> Seen:
    """The pairs of ``seen`` whose item is in the catalogue, sorted by user: only those can be
    recommended or feed the model, and each shard of (sorted) users takes one contiguous
    slice."""
    seen_users, seen_items = seen
    known = catalogue.index(seen_items) >= 0
    order = np.argsort(seen_users[known], kind="stable")
    return seen_users[known][order], seen_items[known][order]


def user_cut(
    users: np.ndarray,
    seen: Seen,
    catalogue: int,
    shard_rows: int,
    *,
    files: Sequence[str],
    figures: Mapping[str, Any],
    committed: Callable[[], None],
) -> ShardCut:
    """The audience (sorted ``users``) cut into ranges of users carrying their history
    (:func:`user_shards`); users with no unseen item of the ``catalogue`` left are quarantined
    (``no_unseen_items``) and travel in shards of their own after them."""
    eligible = eligible_items(users, seen, catalogue, np.ones(len(seen[1]), bool))
    plan = user_plan(users, eligible)
    held = np.zeros(len(users), bool)
    held[plan.positions] = True
    layout = {"shard_layout": "user_ranges", **shard_counts(len(users), plan.count, shard_rows)}

    def inputs(landed: Iterable[pa.RecordBatch]) -> Iterator[ShardInput]:
        return user_shards(users, seen, held, shard_rows)

    return ShardCut(inputs, layout, plan=plan, files=files, figures=figures, committed=committed)


def shard_lists(rows: pa.Table, catalogue: int, k: int) -> tuple[Seen, Observe]:
    """A shard's history (its users' seen items) and the observer of its lists, which each
    user's items left unseen in the ``catalogue`` decide: the same for a shard's users alone
    as for the day's."""
    users = rows["user_id"].to_numpy()
    seen = _shard_seen(rows)
    eligible = eligible_items(users, seen, catalogue, np.ones(len(seen[1]), bool))
    return seen, list_observer(users, eligible, k)


def record_ranking(stats: StreamStats, counts: Counter) -> None:
    """Adds a model call's ranking figures to the shard's statistics, and clears them."""
    for name in RANKING_COUNTS:
        stats.count(f"{RANKING_PREFIX}{name}", counts[name])
    counts.clear()
