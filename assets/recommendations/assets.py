"""Recommendations: landed interactions, the two-tower model, and nightly top-K lists."""

from collections import Counter
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from dagster import AssetExecutionContext, Config, Failure, MaterializeResult, asset
from pydantic import Field

from assets.checkpointing import SpotSafeRun, spot_safe
from assets.common import (
    record_landing_read,
    PartitionReport,
    fail_fast_on_bad_input,
    landing_result,
    landing_timezone_metadata,
    log_partition,
    partition_dates,
    scoring_result,
)
from assets.recommendations.gates import (
    INTERACTION_SUITES,
    RECOMMENDATION_SUITES,
    interactions_check_results,
    recommendation_check_results,
)
from assets.recommendations.history import read_day, read_interactions
from assets.recommendations.quality import (
    eligible_items,
    list_observer,
    screen_interactions,
    user_plan,
    users_answered,
)
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
from resources.quality import (
    QualityConfig,
    fail_fast_on_bad_rows,
    preload_great_expectations,
    quarantine_limit,
    quarantine_metadata,
)
from resources.storage import StorageResource

GROUP = "recommendations"
COUNTED = (
    "model_users",
    "cold_start_users",
    "users_short_of_k",
    "unknown_items",
    "unknown_item_interactions",
)


class InteractionsConfig(QualityConfig):
    deadline_hours: float = Field(
        default=3.0,
        description="Hours after its UTC day ends by which a day's events should have landed "
        "(the recommendations schedule runs at 03:00).",
    )


@asset(
    partitions_def=daily_partitions,
    backfill_policy=backfill_policy,
    group_name=GROUP,
    kinds={"parquet"},
    check_specs=[suite.spec() for suite in INTERACTION_SUITES.values()],
)
def interactions(
    context: AssetExecutionContext, config: InteractionsConfig, storage: StorageResource
) -> MaterializeResult:
    """Every view, click and purchase users made on the catalogue during one UTC day, as
    landed by the event pipeline. Materialising it checks each file against the contract
    (user_id, item_id, ts, event, weight; no interaction without its ids), counts the day's
    events, and warns when events fall outside the day or the day landed late."""
    preload_great_expectations()
    store = storage.store()
    landed = landing_result(context, store, INTERACTIONS, INTERACTIONS_SCHEMA)
    with fail_fast_on_bad_input():
        screens = {
            date: screen_interactions(store, date, config.check_sample_rows, config.check_seed)
            for date in partition_dates(context)
        }
    checks = interactions_check_results(
        store,
        screens,
        deadline_hours=config.deadline_hours,
        sample_rows=config.check_sample_rows,
        seed=config.check_seed,
    )
    return MaterializeResult(metadata=landed.metadata, check_results=checks)


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


class UserRecommendationsConfig(QualityConfig):
    k: int = Field(default=20, ge=1, le=1000, description="Recommendations per user.")


@asset(
    partitions_def=daily_partitions,
    backfill_policy=backfill_policy,
    deps=[interactions, recommendation_model],
    pool=GPU_POOL,
    freshness_policy=scored_by_0700_utc,
    group_name=GROUP,
    kinds={"pytorch", "parquet"},
    check_specs=[suite.spec() for suite in RECOMMENDATION_SUITES.values()],
)
def user_recommendations(
    context: AssetExecutionContext,
    config: UserRecommendationsConfig,
    storage: StorageResource,
    inference: InferenceResource,
) -> MaterializeResult:
    """The top-K items to show each user who was active that day, best first, never an item
    they have already interacted with. Users the model has not met yet get the most popular
    items they have not seen (counted as cold_start_users). A user who has already seen every
    item is quarantined to `user_recommendations_quarantine` rather than silently left out."""
    preload_great_expectations()
    store = storage.store()
    record_landing_read(context, store, INTERACTIONS, partition_dates(context))
    with fail_fast_on_bad_input():
        version = current_recommender_version(store)
    key = f"{RECOMMENDATION_MODEL}:{version}"
    model = inference.model(key, lambda runtime: load_recommender(store, version, runtime))
    block = block_size_for(len(model.items), inference.max_batch_size)
    landed = store.landing_dates(INTERACTIONS)
    limit = quarantine_limit(config.max_quarantine_rate)
    reports: list[PartitionReport] = []
    active: dict[str, int] = {}
    counts = Counter(dict.fromkeys(COUNTED, 0))
    with spot_safe(context, store, inference) as run:
        for date in partition_dates(context):
            with fail_fast_on_bad_input(), fail_fast_on_bad_rows():
                report, active[date] = _score_day(
                    run, date, model, version, config.k, block, landed, counts, limit
                )
            reports.append(report)
            log_partition(context, USER_RECOMMENDATIONS, report)
    checks = recommendation_check_results(
        store,
        reports,
        active,
        k=config.k,
        version=version,
        sample_rows=config.check_sample_rows,
        seed=config.check_seed,
    )
    result = scoring_result(
        reports,
        model_version=version,
        device=inference.runtime.describe(),
        model_loads=inference.load_count(key),
        extra={
            **run.metadata(),
            **landing_timezone_metadata(store, INTERACTIONS),
            "k": config.k,
            "block_users": block,
            "oom_backoffs": model.block_sizings.ooms,
            **counts,
            **quarantine_metadata([r.shards for r in reports if r.shards is not None]),
        },
    )
    return MaterializeResult(metadata=result.metadata, check_results=checks)


def _score_day(
    run: SpotSafeRun,
    date: str,
    model: Recommender,
    version: str,
    k: int,
    block: int,
    landed: list[str],
    counts: Counter,
    max_quarantine_rate: float,
) -> tuple[PartitionReport, int]:
    """Recommends for the day's active users in checkpointed shards of users.

    Returns:
        the report, and how many users were active that day.
    """
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

    known_items = model.items.index(seen_items) >= 0
    eligible = eligible_items(day.users, (seen_users, seen_items), len(model.items), known_items)
    plan = user_plan(day.users, eligible)
    plan.check_rate(max_quarantine_rate, f"{USER_RECOMMENDATIONS} {date}")
    report = run.partition(
        USER_RECOMMENDATIONS,
        date,
        RECOMMENDATIONS_SCHEMA,
        [pa.record_batch({"user_id": pa.array(day.users, pa.int64())})],
        transform,
        prepare=lambda batch: batch["user_id"].to_numpy(),
        batch_size=block,
        inputs=[f for d in history for f in store.landing_files(INTERACTIONS, d)],
        depends_on={"model": version, "k": k},
        quarantine=plan,
        observe=list_observer(day.users, eligible, k),
        count_out=users_answered,
    )
    return report, len(day.users)


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
