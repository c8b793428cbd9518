"""Blocking checks on the published recommendations, one predicate each, reading the lists in
full. (The interactions' contract, quarantine included, is the `interactions` suites.)"""

import numpy as np
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    DagsterInvariantViolationError,
    asset_check,
)

from assets.checkpointing import quarantine_asset
from assets.recommendations.assets import user_recommendations
from assets.recommendations.audience import recorded_audience
from assets.recommendations.history import read_interactions
from assets.recommendations.schemas import INTERACTIONS, USER_RECOMMENDATIONS
from resources.storage import DataStore, StorageResource


@asset_check(asset=user_recommendations, blocking=True)
def recommendation_lists_are_ranked(
    context: AssetCheckExecutionContext, storage: StorageResource
) -> AssetCheckResult:
    """Each user's ranks run 1..n without gaps, scores never rise with rank, no item twice."""
    store = storage.store()
    bad: dict[str, int] = {}
    for date in _dates(context, store):
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
def every_audience_user_has_recommendations(
    context: AssetCheckExecutionContext, storage: StorageResource
) -> AssetCheckResult:
    """The users in the output, with those quarantined (nothing left to recommend), are exactly
    the day's audience: recomputed from the landing days the scoring step recorded reading,
    under the definition it recorded (every user seen within audience_days, or every user)."""
    store = storage.store()
    mismatched: dict[str, int] = {}
    unrecorded: list[str] = []
    for date in _dates(context, store):
        audience = recorded_audience(store, date)
        listed = store.read_output(USER_RECOMMENDATIONS, date)["user_id"].to_numpy()
        held = quarantine_asset(USER_RECOMMENDATIONS)
        if store.output_exists(held, date):
            listed = np.concatenate([listed, store.read_output(held, date)["user_id"].to_numpy()])
        if audience is None:
            unrecorded.append(date)
            mismatched[date] = len(np.unique(listed))
            continue
        mismatched[date] = len(np.setxor1d(audience.users, listed))
    result = _result("mismatched_users", mismatched)
    if unrecorded:
        result = AssetCheckResult(
            passed=False,
            metadata={**result.metadata, "no_audience_recorded": ", ".join(unrecorded)},
            description="no audience was recorded for these days: re-run user_recommendations",
        )
    return result


@asset_check(asset=user_recommendations, blocking=True)
def no_seen_items_recommended(
    context: AssetCheckExecutionContext, storage: StorageResource
) -> AssetCheckResult:
    """No user is recommended an item they interacted with on or before that day."""
    store = storage.store()
    landed = store.landing_dates(INTERACTIONS)
    hits: dict[str, int] = {}
    for date in _dates(context, store):
        out = store.read_output(USER_RECOMMENDATIONS, date)
        recommended = (out["user_id"].to_numpy(), out["item_id"].to_numpy())
        users = np.unique(recommended[0])
        seen = read_interactions(store, [d for d in landed if d <= date], users=users)
        keys, seen_keys = _pair_keys(recommended, seen.pairs)
        hits[date] = int(np.isin(keys, seen_keys).sum())
    return _result("seen_items_recommended", hits)


def _dates(context: AssetCheckExecutionContext, store: DataStore) -> list[str]:
    """The run's partitions; when a check runs on its own, the latest published day."""
    try:
        return list(context.partition_keys)
    except DagsterInvariantViolationError:
        pass  # a run of the checks alone (e.g. from the UI) is not partitioned
    landed = store.landing_dates(INTERACTIONS)
    return [d for d in landed if store.output_exists(USER_RECOMMENDATIONS, d)][-1:]


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
    recommendation_lists_are_ranked,
    every_audience_user_has_recommendations,
    no_seen_items_recommended,
]
