"""Recommendations from a trained model, and how to judge them: the top-K unseen items of each
user (by the model where it can rank them, else by popularity) and recall@K on a held-out day.

The models are the two-tower recommender (``inference.recs.two_tower``) and EASE
(``inference.recs.ease``); ranking is exact, by ``inference.recs.topk_blocks``. Import their names from
those modules.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from inference.recs.sparse import SparseRows, Vocabulary

# block_size_for is listed in __all__ only while assets/recommendations/scoring.py imports it
# from here rather than from inference.recs.topk_blocks.
from inference.recs.topk_blocks import block_size_for, iter_top_k, top_k
from inference.recs.two_tower import Recommender

if TYPE_CHECKING:
    from inference.recs.ease import EaseRecommender

__all__ = [
    "HoldoutRecall",
    "RecommendationBatch",
    "block_size_for",
    "holdout_recall",
    "recall_at_k",
    "recommend",
]


@dataclass(frozen=True)
class RecommendationBatch:
    """Recommendation rows for one block of users, flat: one row per (user, rank)."""

    user_ids: np.ndarray
    ranks: np.ndarray  # 1..n per user, contiguous, n = k unless too few items are left
    item_ids: np.ndarray
    scores: np.ndarray  # float32, descending within a user
    users: int
    users_short_of_k: int
    cold_start: bool  # ranked by popularity: the model has never seen these users
    seconds: float


def recommend(
    model: Recommender | EaseRecommender,
    user_ids: np.ndarray,
    seen: tuple[np.ndarray, np.ndarray],
    k: int,
    block_size: int,
) -> Iterator[RecommendationBatch]:
    """Top-``k`` unseen items for each user: by the model where it can rank them (two-tower:
    users it was trained on; EASE: users with history in the catalogue), else by popularity.

    Args:
        model: the trained recommender (two-tower or EASE), on the compute device.
        user_ids: users to recommend for (duplicates are ignored).
        seen: (user_ids, item_ids) of their history; these items are never recommended.
            Pairs of other users, or of items outside the model's catalogue, are ignored.
        k: recommendations per user.
        block_size: users per scoring block.
    """
    user_ids = np.unique(np.asarray(user_ids, dtype=np.int64))
    rows = Vocabulary(user_ids).index(seen[0])
    history = SparseRows.from_pairs(rows, model.items.index(seen[1]), len(user_ids))
    model_rows = model.users.index(user_ids)
    personal = model.personalised(model_rows, history)
    for cold_start in (False, True):
        members = np.flatnonzero(personal != cold_start)
        if len(members) == 0:
            continue
        seen = history.select(members)
        scorer = model.scorer(None if cold_start else model_rows[members], len(members), seen)
        blocks = iter_top_k(*scorer, seen, k, block_size, model.block_sizings, tiled=model.tiled)
        for block in blocks:
            valid = block.items >= 0
            counts = valid.sum(axis=1)
            block_users = user_ids[members[block.start : block.start + len(block.items)]]
            yield RecommendationBatch(
                user_ids=np.repeat(block_users, counts),
                ranks=np.nonzero(valid)[1] + 1,
                item_ids=model.items.ids[block.items[valid]],
                scores=block.scores[valid],
                users=len(block_users),
                users_short_of_k=int((counts < k).sum()),
                cold_start=cold_start,
                seconds=block.seconds,
            )


def recall_at_k(recommended: np.ndarray, relevant: SparseRows) -> tuple[float, int]:
    """Mean over users with any relevant item of hits / min(k, number of relevant items).

    Returns:
        (recall, number of users it averages over).
    """
    k = recommended.shape[1]
    lengths = relevant.row_lengths()
    users = np.flatnonzero(lengths > 0)
    if len(users) == 0:
        return 0.0, 0
    local, cols, _ = relevant.take(users)
    hit = (recommended[users[local]] == cols[:, None]).any(axis=1)
    hits = np.bincount(local, weights=hit, minlength=len(users))
    return float(np.mean(hits / np.minimum(k, lengths[users]))), len(users)


@dataclass(frozen=True)
class HoldoutRecall:
    """Recall@K on a held-out day: the model against a popularity ranking."""

    model: float
    popularity: float
    users: int
    k: int


def holdout_recall(
    model: Recommender | EaseRecommender,
    history: tuple[np.ndarray, np.ndarray],
    holdout: tuple[np.ndarray, np.ndarray],
    k: int = 20,
    block_size: int = 4096,
) -> HoldoutRecall:
    """Recall@k of the model and of popularity on items users first took on a later day.

    Both rankings exclude the user's history; they are judged on users the model knows who
    interacted with at least one catalogue item on the held-out day that they had not before.

    Args:
        model: trained on ``history``.
        history: (user_ids, item_ids) the model was trained on.
        holdout: (user_ids, item_ids) of the held-out day.
        k: list length.
        block_size: users per scoring block.
    """
    n = len(model.users)
    seen = SparseRows.from_pairs(model.users.index(history[0]), model.items.index(history[1]), n)
    later = SparseRows.from_pairs(model.users.index(holdout[0]), model.items.index(holdout[1]), n)
    relevant = later.minus(seen)
    users = np.flatnonzero(relevant.row_lengths() > 0)
    seen_users, relevant_users = seen.select(users), relevant.select(users)
    scorer = model.scorer(users, len(users), seen_users)
    _, ranked = top_k(*scorer, seen_users, k, block_size, tiled=model.tiled)
    _, popular = top_k(*model.scorer(None, len(users)), seen_users, k, block_size, model.tiled)
    return HoldoutRecall(
        model=recall_at_k(ranked, relevant_users)[0],
        popularity=recall_at_k(popular, relevant_users)[0],
        users=len(users),
        k=k,
    )
