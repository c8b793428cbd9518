"""Recommendations: landed interactions, the two-tower model, and nightly top-K lists."""

from collections import Counter
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from dagster import AssetExecutionContext, Config, Failure, MaterializeResult, asset
from pydantic import Field

from assets.checkpointing import SpotSafeRun, spot_safe
from assets.common import (
    PartitionReport,
    fail_fast_on_bad_input,
    landing_result,
    log_partition,
    partition_dates,
    scoring_result,
)
from assets.recommendations.history import read_day, read_interactions
from assets.recommendations.schemas import (
    INTERACTIONS,
    INTERACTIONS_SCHEMA,
    RECOMMENDATION_MODEL,
    RECOMMENDATIONS_SCHEMA,
    USER_RECOMMENDATIONS,
)
from assets.recommendations.training import (
    current_model,
    current_recommender_version,
    load_recommender,
    train_and_save,
)
from inference.modelstore import ModelNotFoundError
from inference.recommend import (
    RecommendationBatch,
    Recommender,
    TrainConfig,
    block_size_for,
    recommend,
)
from orchestration.automation import GPU_POOL, scored_by_0700_utc
from orchestration.partitions import backfill_policy, daily_partitions
from resources.inference import InferenceResource
from resources.storage import StorageResource

GROUP = "recommendations"
COUNTED = (
    "model_users",
    "cold_start_users",
    "users_short_of_k",
    "unknown_items",
    "unknown_item_interactions",
)


@asset(
    partitions_def=daily_partitions,
    backfill_policy=backfill_policy,
    group_name=GROUP,
    kinds={"parquet"},
)
def interactions(context: AssetExecutionContext, storage: StorageResource) -> MaterializeResult:
    """Every view, click and purchase users made on the catalogue during one UTC day, as
    landed by the event pipeline. Materialising it checks each file against the contract
    (user_id, item_id, ts, event, weight) and counts the day's events."""
    return landing_result(context, storage.store(), INTERACTIONS, INTERACTIONS_SCHEMA)


class RecommendationModelConfig(Config):
    retrain: bool = Field(default=False, description="Train even if a current model exists.")
    dims: int = Field(default=64, ge=4, le=512, description="Embedding dimensions.")
    epochs: int = Field(default=10, ge=1, le=200, description="Passes over the users.")


@asset(deps=[interactions], group_name=GROUP, kinds={"pytorch"}, pool=GPU_POOL)
def recommendation_model(
    context: AssetExecutionContext,
    config: RecommendationModelConfig,
    storage: StorageResource,
    inference: InferenceResource,
) -> MaterializeResult:
    """What each user is likely to want next: user and item embeddings learned from every day
    of interactions landed so far. Quality is recall@20 on the last day held out, next to
    recommending the most popular items. The current model is reused unless `retrain` is set."""
    store = storage.store()
    if not config.retrain:
        try:
            trained = current_model(store)
            context.log.info(f"reusing {RECOMMENDATION_MODEL} {trained.version}")
            return MaterializeResult(metadata=trained.metadata(reused=True))
        except ModelNotFoundError:
            context.log.info(f"no current {RECOMMENDATION_MODEL}: training one")
    dates = store.landing_dates(INTERACTIONS)
    if not dates:
        where = store.uri(store.path("landing", INTERACTIONS))
        raise Failure(
            f"cannot train {RECOMMENDATION_MODEL}: no '{INTERACTIONS}' data at {where}",
            allow_retries=False,
        )
    train = TrainConfig(dims=config.dims, epochs=config.epochs)
    with fail_fast_on_bad_input():
        trained = train_and_save(store, dates, train, inference.runtime.device)
    metrics = trained.manifest["metrics"]
    context.log.info(f"trained {RECOMMENDATION_MODEL} {trained.version}: {metrics}")
    return MaterializeResult(metadata=trained.metadata(reused=False))


class UserRecommendationsConfig(Config):
    k: int = Field(default=20, ge=1, le=1000, description="Recommendations per user.")


@asset(
    partitions_def=daily_partitions,
    backfill_policy=backfill_policy,
    deps=[interactions, recommendation_model],
    pool=GPU_POOL,
    freshness_policy=scored_by_0700_utc,
    group_name=GROUP,
    kinds={"pytorch", "parquet"},
)
def user_recommendations(
    context: AssetExecutionContext,
    config: UserRecommendationsConfig,
    storage: StorageResource,
    inference: InferenceResource,
) -> MaterializeResult:
    """The top-K items to show each user who was active that day, best first, never an item
    they have already interacted with. Users the model has not met yet get the most popular
    items they have not seen (counted as cold_start_users)."""
    store = storage.store()
    with fail_fast_on_bad_input():
        version = current_recommender_version(store)
    key = f"{RECOMMENDATION_MODEL}:{version}"
    model = inference.model(key, lambda runtime: load_recommender(store, version, runtime))
    block = block_size_for(len(model.items), inference.max_batch_size)
    landed = store.landing_dates(INTERACTIONS)
    reports: list[PartitionReport] = []
    counts = Counter(dict.fromkeys(COUNTED, 0))
    with spot_safe(context, store, inference) as run:
        for date in partition_dates(context):
            with fail_fast_on_bad_input():
                report = _score_day(run, date, model, version, config.k, block, landed, counts)
            reports.append(report)
            log_partition(context, USER_RECOMMENDATIONS, report)
    return scoring_result(
        reports,
        model_version=version,
        device=inference.runtime.describe(),
        model_loads=inference.load_count(key),
        extra={**run.metadata(), "k": config.k, "block_users": block, **counts},
    )


def _score_day(
    run: SpotSafeRun,
    date: str,
    model: Recommender,
    version: str,
    k: int,
    block: int,
    landed: list[str],
    counts: Counter,
) -> PartitionReport:
    """Recommends for the day's active users in checkpointed shards of users."""
    store = run.store
    # Seen means on any day up to and including this one, so re-running an old partition
    # does not exclude items the user only found later.
    history = [d for d in landed if d <= date]
    day = read_day(store, date, model.items)
    seen_users, seen_items = read_interactions(store, history, users=day.users).pairs
    known = int((model.users.index(day.users) >= 0).sum())
    counts.update(
        model_users=known,
        cold_start_users=len(day.users) - known,
        unknown_items=day.unknown_items,
        unknown_item_interactions=day.unknown_item_interactions,
    )

    def transform(batch: pa.RecordBatch, users: np.ndarray) -> pa.Table:
        mine = np.isin(seen_users, users)
        blocks = recommend(model, users, (seen_users[mine], seen_items[mine]), k, block)
        return pa.Table.from_batches(
            list(_record_batches(blocks, version, counts)), RECOMMENDATIONS_SCHEMA
        )

    return run.partition(
        USER_RECOMMENDATIONS,
        date,
        RECOMMENDATIONS_SCHEMA,
        [pa.record_batch({"user_id": pa.array(day.users, pa.int64())})],
        transform,
        prepare=lambda batch: batch["user_id"].to_numpy(),
        batch_size=block,
        inputs=[f for d in history for f in store.landing_files(INTERACTIONS, d)],
        depends_on={"model": version, "k": k},
    )


def _record_batches(
    batches: Iterator[RecommendationBatch], version: str, counts: Counter
) -> Iterator[pa.RecordBatch]:
    for b in batches:
        counts["users_short_of_k"] += b.users_short_of_k
        yield pa.record_batch(
            [
                pa.array(b.user_ids, pa.int64()),
                pa.array(b.ranks.astype(np.int16)),
                pa.array(b.item_ids, pa.int64()),
                pa.array(b.scores.astype(np.float32)),
                pa.array(np.full(len(b.user_ids), version, dtype=object), pa.string()),
            ],
            schema=RECOMMENDATIONS_SCHEMA,
        )
