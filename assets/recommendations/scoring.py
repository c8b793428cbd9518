"""``user_recommendations`` as a spec for the scoring runner: load the current recommender,
rank the day's audience.

The audience is every user seen within the trailing window (or ever); each user's history is
every landed day up to and including the scored one, so re-running an old day does not exclude
items the user only found later. Users are scored in checkpointed shards; with the ``ray``
executor each shard carries its users' history to a worker (assets/recommendations/user_shards).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
from pydantic import Field

from assets.checkpointing import DEFAULT_SHARD_ROWS, Shards, SpotSafeRun, Work
from assets.common import PartitionReport
from assets.recommendations.audience import (
    DEFAULT_AUDIENCE_DAYS,
    AudienceMode,
    build_audience,
    save_audience,
)
from assets.recommendations.gates import RECOMMENDATION_SUITES, recommendation_check_results
from assets.recommendations.history import read_day, read_interactions
from assets.recommendations.quality import eligible_items, list_observer, user_plan, users_answered
from assets.recommendations.schemas import (
    INTERACTIONS,
    RECOMMENDATION_MODEL,
    RECOMMENDATIONS_SCHEMA,
    USER_RECOMMENDATIONS,
)
from assets.recommendations.training import current_recommender_version, load_recommender
from assets.recommendations.user_shards import (
    LoadRecommender,
    UserShardProgram,
    rank_block,
    ranking_counts,
    shard_counts,
    user_shards,
)
from assets.runner import Day, Model, ScoringSpec
from inference.quarantine import QuarantinePlan
from inference.recommend import block_size_for
from resources.inference import InferenceResource
from resources.quality import QualityConfig
from resources.storage import DataStore


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


def load(
    store: DataStore,
    inference: InferenceResource,
    config: UserRecommendationsConfig,
    version: str | None = None,
) -> Model:
    """The champion, or ``version`` where the run chose another (assets/staleness.py)."""
    version = version or current_recommender_version(store)
    key = f"{RECOMMENDATION_MODEL}:{version}"
    model = inference.model(key, lambda runtime: load_recommender(store, version, runtime))
    block = block_size_for(len(model.items), inference.max_batch_size)
    settings = {"k": config.k, "audience": config.audience, "audience_days": config.audience_days}
    return Model(version, key, model, metadata={**settings, "block_users": block})


def day(
    run: SpotSafeRun, date: str, model: Model, config: UserRecommendationsConfig, limit: float
) -> Day:
    """Recommends for the day's audience in checkpointed shards of users."""
    store, recommender, version = run.store, model.value, model.version
    block = model.metadata["block_users"]
    activity = read_day(store, date, recommender.items)
    activity.plan.check_rate(limit, f"{INTERACTIONS} {date}")
    landed = store.landing_dates(INTERACTIONS)
    audience = build_audience(store, landed, date, config.audience, config.audience_days)
    users = audience.users
    history = [d for d in landed if d <= date]
    seen_users, seen_items = read_interactions(store, history, users=users).pairs
    # Only catalogue items can be recommended or feed the model: the rest need not be held.
    # Sorted by user, so each block of (sorted) users takes one contiguous slice.
    known_items = recommender.items.index(seen_items) >= 0
    order = np.argsort(seen_users[known_items], kind="stable")
    seen_users, seen_items = seen_users[known_items][order], seen_items[known_items][order]
    known = int((recommender.users.index(users) >= 0).sum())
    counts = Counter(
        model_users=known,
        cold_start_users=len(users) - known,
        popularity_ranked_users=0,
        users_short_of_k=0,
        unknown_items=activity.unknown_items,
        unknown_item_interactions=activity.unknown_item_interactions,
        interaction_rows=activity.rows,
        interaction_rows_used=activity.rows_used,
        interaction_rows_quarantined=activity.plan.count,
    )

    def transform(batch: pa.RecordBatch, block_users: np.ndarray) -> pa.Table:
        seen = (seen_users, seen_items)
        return rank_block(recommender, seen, block_users, config.k, block, version, counts)

    everything = np.ones(len(seen_items), bool)
    eligible = eligible_items(users, (seen_users, seen_items), len(recommender.items), everything)
    plan = user_plan(users, eligible)
    plan.check_rate(limit, f"{USER_RECOMMENDATIONS} {date}")
    shards = None
    if run.distributed:
        shards = _by_user(run, model, config, users, (seen_users, seen_items), plan)
    work = Work(
        RECOMMENDATIONS_SCHEMA,
        [pa.record_batch({"user_id": pa.array(users, pa.int64())})],
        transform,
        inputs=[f for d in history for f in store.landing_files(INTERACTIONS, d)],
        depends_on={
            "model": version,
            "k": config.k,
            "audience": audience.mode,
            "audience_days": audience.days,
        },
        prepare=lambda batch: batch["user_id"].to_numpy(),
        batch_size=block,
        quarantine=plan,
        observe=list_observer(users, eligible, config.k),
        count_out=users_answered,
        shards=shards,
    )

    def checks(report: PartitionReport):
        return recommendation_check_results(
            store,
            [report],
            {date: len(users)},
            {date: activity.unknown_item_share},
            k=config.k,
            version=version,
            max_unknown_item_share=config.max_unknown_item_share,
            sample_rows=config.check_sample_rows,
            seed=config.check_seed,
        )

    def metadata(report: PartitionReport) -> dict:
        figures = {"oom_backoffs": recommender.block_sizings.ooms, **counts}
        if shards is not None:  # ranked on the workers: their figures came with the shards
            figures.update(ranking_counts(report.shards.stats))
        return {
            "audience_users": len(users),
            "unknown_item_share": round(activity.unknown_item_share, 6),
            **figures,
        }

    return Day(work, checks, metadata, on_commit=lambda report: save_audience(store, audience))


def _by_user(
    run: SpotSafeRun,
    model: Model,
    config: UserRecommendationsConfig,
    users: np.ndarray,
    seen: tuple[np.ndarray, np.ndarray],
    plan: QuarantinePlan,
) -> Shards:
    """The audience cut for workers elsewhere (assets/recommendations/user_shards): ranges of
    users carrying their history, the model loaded once per worker."""
    settings = run.inference
    shard_rows = run.shard_rows(DEFAULT_SHARD_ROWS)
    held = np.zeros(len(users), bool)  # users with nothing left to recommend: no history
    held[plan.positions] = True

    def inputs():
        return user_shards(users, seen, held, shard_rows)

    program = UserShardProgram(
        model.key,
        LoadRecommender(run.store, model.version, settings.device, settings.precision),
        model.version,
        config.k,
        model.metadata["block_users"],
    )
    layout = {"shard_layout": "user_ranges", **shard_counts(len(users), plan.count, shard_rows)}
    return Shards(program, inputs, layout)


USER_RECOMMENDATIONS_SPEC = ScoringSpec(
    USER_RECOMMENDATIONS, INTERACTIONS, RECOMMENDATION_SUITES, load, day
)
