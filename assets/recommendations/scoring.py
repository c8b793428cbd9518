"""``user_recommendations``: the top-K items for each user of the day's audience, declared on
the public module (``nightshift``).

The audience is every user seen within the trailing window (or ever); each user's history is
every landed day up to and including the scored one, so re-running an old day does not exclude
items the user only found later. The audience is cut into checkpointed shards of users, each
carrying its users' history (inference/recs/user_shards.py), and ranked by
:class:`RecommendationPredictor`, which loads the registered recommender once per process or Ray
actor.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
from dagster import AssetCheckResult
from pydantic import Field

from assets.nightly import Checks, Landing, Output, Predictor, nightly
from assets.partitions import PartitionReport
from assets.recommendations.audience import DEFAULT_AUDIENCE_DAYS, build_audience, save_audience
from assets.recommendations.gates import recommendation_check_results
from assets.recommendations.history import read_day, read_interactions, unusable_plan
from assets.recommendations.landing import interactions
from assets.recommendations.list_checks import LIST_CHECKS, list_check_results
from assets.recommendations.model import recommendation_model
from assets.recommendations.schemas import (
    GROUP,
    INTERACTIONS,
    INTERACTIONS_SCHEMA,
    RECOMMENDATIONS_SCHEMA,
    USER_RECOMMENDATIONS,
)
from assets.recommendations.training import current_recommender_version, load_recommender
from inference.engine.device import make_runtime
from inference.engine.invariants import StreamStats
from inference.engine.predictor import ShardCut
from inference.engine.quarantine import QuarantinePlan
from inference.engine.work import Sizes
from inference.recs.audience import AudienceMode
from inference.recs.recommend import block_size_for
from inference.recs.user_shards import (
    catalogue_history,
    rank_block,
    ranking_counts,
    record_ranking,
    shard_lists,
    user_cut,
)
from resources.inference import InferenceResource
from resources.quality import QualityConfig, quarantine_limit
from resources.storage import DataStore

__all__ = [
    "RecommendationPredictor",
    "USER_RECOMMENDATIONS_SPEC",
    "UserRecommendationsConfig",
    "user_recommendations",
]

LIST_COLUMNS = ("user_id", "rank", "item_id", "score")


class UserRecommendationsConfig(QualityConfig):
    k: int = Field(default=20, ge=1, le=1000, description="Recommendations per user.")
    audience: AudienceMode = Field(
        default="recent",
        description="Who gets a list: recent = every user seen within the trailing "
        "audience_days (up to and including the day); all = every user seen on any day.",
    )
    audience_days: int = Field(
        default=DEFAULT_AUDIENCE_DAYS, ge=1, description="The recent audience's window in days."
    )
    max_unknown_item_share: float = Field(
        default=0.25,
        ge=0.0,
        le=1.0,
        description="Warn when more of the day's interactions than this are with items the "
        "model does not know (unknown_item_share_below_limit).",
    )


class RecommendationPredictor(Predictor):
    """The registered recommender (``recommendation_model``): the champion, or the version the
    run chose (assets/staleness.py). Each shard gets a copy holding its users' history; a model
    call ranks a block of users and answers with their lists, never an item already seen."""

    k: int = 20

    def choose(self, store: DataStore, version: str | None) -> None:
        self.store = store
        self.chosen = version or current_recommender_version(store)

    def version(self) -> str:
        return self.chosen

    def load(self, device: str) -> None:
        runtime = make_runtime(device, self.precision)
        self.recommender = load_recommender(self.store, self.chosen, runtime)
        self.block = block_size_for(len(self.recommender.items), self.max_batch_size)

    def shard(self, rows: pa.Table, context: Any) -> RecommendationPredictor:
        shard = copy.copy(self)
        shard.seen, shard.observed = shard_lists(rows, len(self.recommender.items), self.k)
        shard.counts = Counter()  # a model call's ranking figures, until recorded
        return shard

    def prepare(self, batch: pa.RecordBatch) -> np.ndarray:
        return batch["user_id"].to_numpy()

    def __call__(self, batch: pa.RecordBatch, block_users: np.ndarray) -> dict[str, Any]:
        ooms = self.recommender.block_sizings.ooms
        lists = rank_block(
            self.recommender,
            self.seen,
            block_users,
            self.k,
            self.block,
            self.chosen,
            RECOMMENDATIONS_SCHEMA,
            self.counts,
        )
        self.counts["oom_backoffs"] += self.recommender.block_sizings.ooms - ooms
        return {name: lists[name] for name in LIST_COLUMNS}

    def observe(self, rows: pa.RecordBatch, output: pa.Table, stats: StreamStats) -> None:
        self.observed(rows, output, stats)

    def record(self, stats: StreamStats) -> None:
        record_ranking(stats, self.counts)

    def describe(self, stats: StreamStats) -> dict[str, Any]:
        # The ranking's own figures came back with the shards, wherever they ran.
        return {"k": self.k, "block_users": self.block, **ranking_counts(stats)}


def audience_cut(
    plan: QuarantinePlan,
    shard_rows: int,
    store: DataStore,
    date: str,
    config: UserRecommendationsConfig,
    model: RecommendationPredictor,
) -> ShardCut:
    """The day's audience with its history, cut into shards of users."""
    recommender = model.recommender
    # The day's interactions that cannot be used (not the audience's quarantine, which the
    # runner limits): too many fail the day before its history is read.
    limit = quarantine_limit(config.max_quarantine_rate, config.quarantine_floor_rows)
    plan.check_rate(limit, f"{INTERACTIONS} {date}")
    activity = read_day(store, date, recommender.items)
    landed = store.landing_dates(INTERACTIONS)
    audience = build_audience(store, landed, date, config.audience, config.audience_days)
    users = audience.users
    history = [d for d in landed if d <= date]
    seen = catalogue_history(
        read_interactions(store, history, users=users).pairs, recommender.items
    )
    known = int((recommender.users.index(users) >= 0).sum())
    figures = {
        "audience": audience.mode,
        "audience_days": audience.days,
        "audience_users": len(users),
        "unknown_item_share": round(activity.unknown_item_share, 6),
        "model_users": known,
        "cold_start_users": len(users) - known,
        "unknown_items": activity.unknown_items,
        "unknown_item_interactions": activity.unknown_item_interactions,
        "interaction_rows": activity.rows,
        "interaction_rows_used": activity.rows_used,
        "interaction_rows_quarantined": activity.plan.count,
    }
    return user_cut(
        users,
        seen,
        len(recommender.items),
        shard_rows,
        files=[f for d in history for f in store.landing_files(INTERACTIONS, d)],
        figures=figures,
        committed=lambda: save_audience(store, audience),
    )


def judged(
    store: DataStore,
    report: PartitionReport,
    version: str,
    config: UserRecommendationsConfig,
    model: RecommendationPredictor,
    figures: dict[str, Any],
) -> list[AssetCheckResult]:
    """The user_recommendations suites over the day's exact figures and sample, and the checks
    of its lists as the store reads them."""
    suites = recommendation_check_results(
        store,
        [report],
        {report.date: figures["audience_users"]},
        {report.date: figures["unknown_item_share"]},
        k=config.k,
        version=version,
        max_unknown_item_share=config.max_unknown_item_share,
        sample_rows=config.check_sample_rows,
        seed=config.check_seed,
    )
    return [*suites, *list_check_results(store, report.date)]


def settings(config: UserRecommendationsConfig) -> dict[str, Any]:
    """The list length and the audience decide the answers beside the model version."""
    return {"k": config.k, "audience": config.audience, "audience_days": config.audience_days}


def sizes(
    config: UserRecommendationsConfig,
    inference: InferenceResource,
    model: RecommendationPredictor,
) -> Sizes:
    return Sizes(batch_size=model.block)


DESCRIPTION = """\
The top-K items to show each user of the day's audience, best first, never an item they
have already interacted with. The audience is every user seen within the trailing
`audience_days` (or every user ever seen, with `audience: all`), so a user who was not
active that day still gets a fresh list from the current model and catalogue. Users the
model cannot rank (no history in its catalogue) get the most popular items they have not
seen (counted as popularity_ranked_users). A user who has already seen every item is
quarantined to `user_recommendations_quarantine` rather than silently left out."""

PIPELINE = nightly(
    USER_RECOMMENDATIONS,
    RecommendationPredictor,
    Landing(
        INTERACTIONS,
        INTERACTIONS_SCHEMA,
        key="user_id",
        asset=interactions,
        screen=unusable_plan,
    ),
    Output(pa.schema(RECOMMENDATIONS_SCHEMA.remove(0)), lists=True),
    Checks(suite="suites/user_recommendations.json", results=judged, described=LIST_CHECKS),
    hour_utc=3,
    description=DESCRIPTION,
    group=GROUP,
    config=UserRecommendationsConfig,
    sizes=sizes,
    depends_on=settings,
    deps=[recommendation_model],
    shards=audience_cut,
)
user_recommendations = PIPELINE.scoring_asset
# The runner's spec of user_recommendations: what its shadow (shadow.py) runs again.
USER_RECOMMENDATIONS_SPEC = PIPELINE.spec
