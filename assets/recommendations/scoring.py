"""``user_recommendations`` as a spec for the scoring runner: load the current recommender,
rank the day's audience.

The audience is every user seen within the trailing window (or ever); each user's history is
every landed day up to and including the scored one, so re-running an old day does not exclude
items the user only found later. Users are scored in checkpointed shards of users, each carrying
its users' history (inference/recs/user_shards.py), wherever the shards run.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from assets.checkpointing import SpotSafeRun
from assets.partitions import PartitionReport
from assets.recommendations.audience import (
    DEFAULT_AUDIENCE_DAYS,
    AudienceMode,
    build_audience,
    save_audience,
)
from assets.recommendations.gates import RECOMMENDATION_SUITES, recommendation_check_results
from assets.recommendations.history import read_day, read_interactions
from assets.recommendations.list_checks import list_check_results, list_check_specs
from assets.recommendations.schemas import (
    INTERACTIONS,
    RECOMMENDATION_MODEL,
    RECOMMENDATIONS_SCHEMA,
    USER_RECOMMENDATIONS,
)
from assets.recommendations.training import (
    LoadRecommender,
    current_recommender_version,
    load_recommender,
)
from assets.runner import Day, Model, ScoringSpec
from inference.engine.quarantine import QuarantinePlan
from inference.engine.work import DEFAULT_SHARD_ROWS, Input, Output, Sizes, Work
from inference.recs.lists import eligible_items, user_plan
from inference.recs.recommend import block_size_for
from inference.recs.user_shards import UserShardProgram, ranking_counts, shard_counts, user_shards
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
    activity = read_day(store, date, recommender.items)
    # The day's interactions that cannot be used (not the audience's quarantine, which the
    # runner limits): too many fail the day before its history is read.
    activity.plan.check_rate(limit, f"{INTERACTIONS} {date}")
    landed = store.landing_dates(INTERACTIONS)
    audience = build_audience(store, landed, date, config.audience, config.audience_days)
    users = audience.users
    history = [d for d in landed if d <= date]
    seen_users, seen_items = read_interactions(store, history, users=users).pairs
    # Only catalogue items can be recommended or feed the model: the rest need not be held.
    # Sorted by user, so each shard of (sorted) users takes one contiguous slice.
    known_items = recommender.items.index(seen_items) >= 0
    order = np.argsort(seen_users[known_items], kind="stable")
    seen = (seen_users[known_items][order], seen_items[known_items][order])
    known = int((recommender.users.index(users) >= 0).sum())
    counts = {
        "model_users": known,
        "cold_start_users": len(users) - known,
        "unknown_items": activity.unknown_items,
        "unknown_item_interactions": activity.unknown_item_interactions,
        "interaction_rows": activity.rows,
        "interaction_rows_used": activity.rows_used,
        "interaction_rows_quarantined": activity.plan.count,
    }
    eligible = eligible_items(users, seen, len(recommender.items), np.ones(len(seen[1]), bool))
    plan = user_plan(users, eligible)
    work = Work(
        _by_user(run, model, config, users, seen, plan),
        _program(run, model, config),
        Output(RECOMMENDATIONS_SCHEMA),
        depends_on={
            "model": version,
            "k": config.k,
            "audience": audience.mode,
            "audience_days": audience.days,
        },
        sizes=Sizes(batch_size=model.metadata["block_users"]),
    )
    work.input.files = [f for d in history for f in store.landing_files(INTERACTIONS, d)]

    def checks(report: PartitionReport):
        suites = recommendation_check_results(
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
        return [*suites, *list_check_results(store, date)]

    def metadata(report: PartitionReport) -> dict:
        # The ranking's own figures came back with the shards, wherever they ran.
        return {
            "audience_users": len(users),
            "unknown_item_share": round(activity.unknown_item_share, 6),
            **counts,
            **ranking_counts(report.shards.stats),
        }

    # One list per user of the audience: what the output's rows answer for.
    return Day(
        work,
        checks,
        metadata,
        on_commit=lambda report: save_audience(store, audience),
        input_rows=len(users),
    )


def _by_user(
    run: SpotSafeRun,
    model: Model,
    config: UserRecommendationsConfig,
    users: np.ndarray,
    seen: tuple[np.ndarray, np.ndarray],
    plan: QuarantinePlan,
) -> Input:
    """The audience cut into ranges of users carrying their history (users with nothing left
    to recommend, quarantined, in shards of their own after them)."""
    shard_rows = run.shard_rows(DEFAULT_SHARD_ROWS)
    held = np.zeros(len(users), bool)
    held[plan.positions] = True
    layout = {"shard_layout": "user_ranges", **shard_counts(len(users), plan.count, shard_rows)}
    return Input(
        shards=lambda: user_shards(users, seen, held, shard_rows), quarantine=plan, layout=layout
    )


def _program(run: SpotSafeRun, model: Model, config: UserRecommendationsConfig) -> UserShardProgram:
    settings = run.inference
    return UserShardProgram(
        model.key,
        LoadRecommender(run.store, model.version, settings.device, settings.precision),
        model.version,
        config.k,
        model.metadata["block_users"],
        RECOMMENDATIONS_SCHEMA,
    )


USER_RECOMMENDATIONS_SPEC = ScoringSpec(
    USER_RECOMMENDATIONS, INTERACTIONS, RECOMMENDATION_SUITES, load, day, list_check_specs()
)
