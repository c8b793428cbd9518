"""Blocking checks on the recommendations domain's data, one predicate each."""

from functools import reduce

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    DagsterInvariantViolationError,
    asset_check,
)

from assets.recommendations.assets import interactions, user_recommendations
from assets.recommendations.history import read_interactions
from assets.recommendations.schemas import (
    EVENT_TYPES,
    INTERACTIONS,
    INTERACTIONS_SCHEMA,
    USER_RECOMMENDATIONS,
)
from resources.storage import DataStore, StorageResource


@asset_check(asset=interactions, blocking=True)
def interaction_events_are_valid(
    context: AssetCheckExecutionContext, storage: StorageResource
) -> AssetCheckResult:
    """Events are view, click or purchase; weights are finite and not negative; ids are set."""
    store = storage.store()
    bad: dict[str, int] = {}
    for date in _dates(context, store, published=False):
        day = store.read_landing(INTERACTIONS, date, INTERACTIONS_SCHEMA)
        weight = day["weight"]
        checks = [
            pc.invert(pc.is_in(day["event"], value_set=pa.array(EVENT_TYPES, pa.string()))),
            pc.invert(pc.is_finite(weight)),
            pc.less(weight, 0),
            pc.is_null(day["user_id"]),
            pc.is_null(day["item_id"]),
        ]
        # A null anywhere makes a check null; fill_null counts such a row as invalid too.
        invalid = [pc.fill_null(check, True) for check in checks]
        bad[date] = int(pc.sum(reduce(pc.or_, invalid)).as_py() or 0)
    return _result("invalid_rows", bad)


@asset_check(asset=user_recommendations, blocking=True)
def recommendation_lists_are_ranked(
    context: AssetCheckExecutionContext, storage: StorageResource
) -> AssetCheckResult:
    """Each user's ranks run 1..n without gaps, scores never rise with rank, no item twice."""
    store = storage.store()
    bad: dict[str, int] = {}
    for date in _dates(context, store, published=True):
        out = store.read_output(USER_RECOMMENDATIONS, date)
        users, ranks = out["user_id"].to_numpy(), out["rank"].to_numpy().astype(np.int64)
        order = np.lexsort((ranks, users))
        users, ranks = users[order], ranks[order]
        items, scores = out["item_id"].to_numpy()[order], out["score"].to_numpy()[order]
        first = np.r_[True, users[1:] != users[:-1]]
        group_start = np.maximum.accumulate(np.where(first, np.arange(len(users)), 0))
        gaps = ranks != np.arange(len(users)) - group_start + 1
        rising = ~first & (np.diff(scores, prepend=np.inf) > 0)
        repeats = len(users) - len(np.unique(np.stack([users, items]), axis=1).T)
        bad[date] = int(gaps.sum() + rising.sum() + repeats)
    return _result("bad_rows", bad)


@asset_check(asset=user_recommendations, blocking=True)
def every_active_user_has_recommendations(
    context: AssetCheckExecutionContext, storage: StorageResource
) -> AssetCheckResult:
    """The users in the output are exactly the users active in that day's interactions."""
    store = storage.store()
    mismatched: dict[str, int] = {}
    for date in _dates(context, store, published=True):
        day = store.read_landing(INTERACTIONS, date, INTERACTIONS_SCHEMA, ["user_id"])
        listed = store.read_output(USER_RECOMMENDATIONS, date)["user_id"]
        mismatched[date] = len(np.setxor1d(day["user_id"].to_numpy(), listed.to_numpy()))
    return _result("mismatched_users", mismatched)


@asset_check(asset=user_recommendations, blocking=True)
def no_seen_items_recommended(
    context: AssetCheckExecutionContext, storage: StorageResource
) -> AssetCheckResult:
    """No user is recommended an item they interacted with on or before that day."""
    store = storage.store()
    landed = store.landing_dates(INTERACTIONS)
    hits: dict[str, int] = {}
    for date in _dates(context, store, published=True):
        out = store.read_output(USER_RECOMMENDATIONS, date)
        recommended = (out["user_id"].to_numpy(), out["item_id"].to_numpy())
        users = np.unique(recommended[0])
        seen = read_interactions(store, [d for d in landed if d <= date], users=users)
        keys, seen_keys = _pair_keys(recommended, seen.pairs)
        hits[date] = int(np.isin(keys, seen_keys).sum())
    return _result("seen_items_recommended", hits)


def _dates(context: AssetCheckExecutionContext, store: DataStore, published: bool) -> list[str]:
    """The run's partitions; when a check runs on its own, the latest day there is to check."""
    try:
        return list(context.partition_keys)
    except DagsterInvariantViolationError:
        pass  # a run of the checks alone (e.g. from the UI) is not partitioned
    landed = store.landing_dates(INTERACTIONS)
    if published:
        landed = [d for d in landed if store.output_exists(USER_RECOMMENDATIONS, d)]
    return landed[-1:]


def _pair_keys(*pairs: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
    """One int64 key per (user, item), comparable across the given pair sets."""
    users = np.unique(np.concatenate([p[0] for p in pairs]))
    items = np.unique(np.concatenate([p[1] for p in pairs]))
    return [np.searchsorted(users, u) * len(items) + np.searchsorted(items, i) for u, i in pairs]


def _result(measure: str, per_date: dict[str, int]) -> AssetCheckResult:
    total = sum(per_date.values())
    metadata: dict = {measure: total}
    if len(per_date) > 1:  # a range run: say which days, not just how many rows
        metadata.update({f"{measure} on {d}": n for d, n in per_date.items() if n})
    return AssetCheckResult(passed=total == 0, metadata=metadata)


RECOMMENDATION_CHECKS = [
    interaction_events_are_valid,
    recommendation_lists_are_ranked,
    every_active_user_has_recommendations,
    no_seen_items_recommended,
]
