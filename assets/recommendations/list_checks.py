"""Three blocking checks on each day's recommendation lists, reading the lists in full: the
ranks, the audience and the items already seen. They run inside user_recommendations on the day
as staged, with its suites, so a day they refuse is never published (write-audit-publish), and
each day of a range run gets its own result. (The interactions' contract, quarantine included,
is the `interactions` suites.)"""

from __future__ import annotations

import numpy as np
from dagster import AssetCheckResult, AssetCheckSpec

from assets.recommendations.audience import recorded_audience
from assets.recommendations.history import read_interactions
from assets.recommendations.schemas import INTERACTIONS, USER_RECOMMENDATIONS
from inference.engine.work import quarantine_asset
from resources.storage import DataStore

RANKED = "recommendation_lists_are_ranked"
AUDIENCE = "every_audience_user_has_recommendations"
UNSEEN = "no_seen_items_recommended"

LIST_CHECKS = {
    RANKED: "Each user's ranks run 1..n without gaps, scores never rise with rank, no item twice.",
    AUDIENCE: "The users in the output, with those quarantined (nothing left to recommend), are "
    "exactly the day's audience: recomputed from the landing days the scoring step recorded "
    "reading, under the definition it recorded (every user seen within audience_days, or "
    "every user).",
    UNSEEN: "No user is recommended an item they interacted with on or before that day.",
}


def list_check_specs() -> list[AssetCheckSpec]:
    """The checks' specs on user_recommendations (made per day by the scoring asset)."""
    return [
        AssetCheckSpec(name, asset=USER_RECOMMENDATIONS, description=text, blocking=True)
        for name, text in LIST_CHECKS.items()
    ]


def list_check_results(store: DataStore, date: str) -> list[AssetCheckResult]:
    """The three checks on ``date``'s lists as the store reads them (the staged day, inside
    the scoring step's audit)."""
    out = store.read_output(USER_RECOMMENDATIONS, date)
    return [_ranked(out), _audience(store, date, out), _unseen(store, date, out)]


def _ranked(out) -> AssetCheckResult:
    users, ranks = out["user_id"].to_numpy(), out["rank"].to_numpy().astype(np.int64)
    order = np.lexsort((ranks, users))
    users, ranks = users[order], ranks[order]
    items, scores = out["item_id"].to_numpy()[order], out["score"].to_numpy()[order]
    first = np.r_[True, users[1:] != users[:-1]]
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(users)), 0))
    gaps = ranks != np.arange(len(users)) - group_start + 1
    rising = ~first & (np.diff(scores, prepend=np.inf) > 0)
    repeats = len(users) - len(np.unique(np.stack([users, items]), axis=1).T)
    bad = int(gaps.sum() + rising.sum() + repeats)
    return AssetCheckResult(check_name=RANKED, passed=bad == 0, metadata={"bad_rows": bad})


def _audience(store: DataStore, date: str, out) -> AssetCheckResult:
    listed = out["user_id"].to_numpy()
    held = quarantine_asset(USER_RECOMMENDATIONS)
    if store.output_exists(held, date):
        listed = np.concatenate([listed, store.read_output(held, date)["user_id"].to_numpy()])
    audience = recorded_audience(store, date)
    if audience is None:
        return AssetCheckResult(
            check_name=AUDIENCE,
            passed=False,
            metadata={"mismatched_users": len(np.unique(listed))},
            description=f"no audience was recorded for {date}: re-run user_recommendations",
        )
    mismatched = len(np.setxor1d(audience.users, listed))
    return AssetCheckResult(
        check_name=AUDIENCE, passed=mismatched == 0, metadata={"mismatched_users": mismatched}
    )


def _unseen(store: DataStore, date: str, out) -> AssetCheckResult:
    recommended = (out["user_id"].to_numpy(), out["item_id"].to_numpy())
    landed = store.landing_dates(INTERACTIONS)
    users = np.unique(recommended[0])
    seen = read_interactions(store, [d for d in landed if d <= date], users=users)
    keys, seen_keys = _pair_keys(recommended, seen.pairs)
    hits = int(np.isin(keys, seen_keys).sum())
    return AssetCheckResult(
        check_name=UNSEEN, passed=hits == 0, metadata={"seen_items_recommended": hits}
    )


def _pair_keys(*pairs: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
    """One int64 key per (user, item), comparable across the given pair sets."""
    users = np.unique(np.concatenate([p[0] for p in pairs]))
    items = np.unique(np.concatenate([p[1] for p in pairs]))
    return [np.searchsorted(users, u) * len(items) + np.searchsorted(items, i) for u, i in pairs]
