"""Recommendations: landed interactions, the model (EASE or two-tower), nightly top-K lists."""

from collections import Counter
from collections.abc import Iterator
from typing import Literal

import numpy as np
import pyarrow as pa
from dagster import AssetExecutionContext, Config, Failure, MaterializeResult, MetadataValue, asset
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
from assets.recommendations.audience import (
    DEFAULT_AUDIENCE_DAYS,
    Audience,
    AudienceMode,
    build_audience,
    save_audience,
)
from assets.recommendations.history import DayActivity, read_day, read_interactions
from assets.recommendations.quality import (
    INTERACTIONS_QUARANTINE,
    QUARANTINE_SCHEMA,
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
    Model,
    current_model,
    current_recommender_version,
    load_recommender,
    train_and_save,
)
from inference.ease import DEFAULT_L2, DEFAULT_MAX_ITEMS, EaseConfig
from inference.modelstore import ModelNotFoundError
from inference.recommend import (
    RecommendationBatch,
    TrainConfig,
    block_size_for,
    recommend,
)
from policy.automation import GPU_POOL, scored_by_0700_utc
from policy.partitions import backfill_policy, daily_partitions
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
    "popularity_ranked_users",
    "users_short_of_k",
    "unknown_items",
    "unknown_item_interactions",
    "interaction_rows",
    "interaction_rows_used",
    "interaction_rows_quarantined",
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
    events, and warns when events fall outside the day or the day landed late. A row with an
    unknown event type or a null, non-finite or negative weight is quarantined to
    `interactions_quarantine` with its reason and never used as history; above the quarantine
    limit the day's check fails, naming the rate and the top reasons."""
    preload_great_expectations()
    store = storage.store()
    landed = landing_result(context, store, INTERACTIONS, INTERACTIONS_SCHEMA)
    limit = quarantine_limit(config.max_quarantine_rate)
    with fail_fast_on_bad_input():
        screens = {
            date: screen_interactions(
                store, date, config.check_sample_rows, config.check_seed, max_rate=limit
            )
            for date in partition_dates(context)
        }
    where = None
    for date, screen in screens.items():
        if screen.quarantined is not None and screen.plan.rate <= limit:
            # Published even when empty, so a re-run after a fix replaces yesterday's rows.
            where = store.publish(
                INTERACTIONS_QUARANTINE, date, [screen.quarantined], QUARANTINE_SCHEMA
            ).uri
        if screen.plan.count:
            context.log.warning(
                f"{INTERACTIONS} {date}: {screen.plan.count} of {screen.plan.rows} rows "
                f"quarantined ({screen.plan.rate:.2%}, limit {limit:.2%}): "
                f"{screen.plan.describe()}"
            )
    checks = interactions_check_results(
        store,
        screens,
        max_quarantine_rate=limit,
        deadline_hours=config.deadline_hours,
        sample_rows=config.check_sample_rows,
        seed=config.check_seed,
    )
    reasons: Counter[str] = Counter()
    for screen in screens.values():
        reasons.update(screen.plan.counts())
    quarantined = sum(s.plan.count for s in screens.values())
    rows = sum(s.plan.rows for s in screens.values())
    metadata = {
        **landed.metadata,
        "rows_used": sum(s.figures["rows_used"] for s in screens.values()),
        "rows_quarantined": quarantined,
        "quarantine_rate": round(quarantined / max(1, rows), 6),
        "quarantine_reasons": MetadataValue.json(dict(reasons.most_common())),
        **({"quarantine": MetadataValue.path(where)} if where else {}),
    }
    return MaterializeResult(metadata=metadata, check_results=checks)


class RecommendationModelConfig(Config):
    retrain: bool = Field(default=False, description="Train even if a current model exists.")
    model: Literal["ease", "two_tower"] = Field(
        default="ease",
        description="ease: closed-form item-item model (best measured on MovieLens 100k, see "
        "benchmarks/eval_recommendations.py); two_tower: learned user and item embeddings.",
    )
    l2: float = Field(default=DEFAULT_L2, gt=0, description="EASE: the ridge penalty lambda.")
    max_items: int = Field(
        default=DEFAULT_MAX_ITEMS,
        ge=1,
        description="EASE: the catalogue is the most popular items up to this many (B is "
        "items x items floats, solved in O(items^3)).",
    )
    dims: int = Field(default=64, ge=4, le=512, description="two_tower: embedding dimensions.")
    epochs: int = Field(default=10, ge=1, le=200, description="two_tower: passes over the users.")


@asset(deps=[interactions], group_name=GROUP, kinds={"pytorch"}, pool=GPU_POOL)
def recommendation_model(
    context: AssetExecutionContext,
    config: RecommendationModelConfig,
    storage: StorageResource,
    inference: InferenceResource,
) -> MaterializeResult:
    """What each user is likely to want next, learned from every day of interactions landed so
    far (quarantined rows left out): by default EASE, which scores each item by how strongly
    the items a user already took predict it; or a two-tower embedding model. Quality is
    recall@20 on the last day held out, next to recommending the most popular items. The
    current model is reused unless `retrain` is set."""
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
    train = (
        EaseConfig(l2=config.l2, max_items=config.max_items)
        if config.model == "ease"
        else TrainConfig(dims=config.dims, epochs=config.epochs)
    )
    with fail_fast_on_bad_input():
        trained = train_and_save(store, dates, train, inference.runtime.device)
    metrics = trained.manifest["metrics"]
    context.log.info(f"trained {RECOMMENDATION_MODEL} {trained.version}: {metrics}")
    return MaterializeResult(metadata=trained.metadata(reused=False))


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
    """The top-K items to show each user of the day's audience, best first, never an item they
    have already interacted with. The audience is every user seen within the trailing
    `audience_days` (or every user ever seen, with `audience: all`), so a user who was not
    active that day still gets a fresh list from the current model and catalogue. Users the
    model cannot rank (no history in its catalogue) get the most popular items they have not
    seen (counted as popularity_ranked_users). A user who has already seen every item is
    quarantined to `user_recommendations_quarantine` rather than silently left out."""
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
    audiences: dict[str, int] = {}
    shares: dict[str, float] = {}
    counts = Counter(dict.fromkeys(COUNTED, 0))
    with spot_safe(context, store, inference) as run:
        for date in partition_dates(context):
            with fail_fast_on_bad_input(), fail_fast_on_bad_rows():
                day = read_day(store, date, model.items)
                day.plan.check_rate(limit, f"{INTERACTIONS} {date}")
                audience = build_audience(
                    store, landed, date, config.audience, config.audience_days
                )
                report = _score_day(
                    run, audience, day, model, version, config, block, landed, counts, limit
                )
            save_audience(store, audience)
            audiences[date], shares[date] = len(audience.users), day.unknown_item_share
            reports.append(report)
            log_partition(context, USER_RECOMMENDATIONS, report)
    checks = recommendation_check_results(
        store,
        reports,
        audiences,
        shares,
        k=config.k,
        version=version,
        max_unknown_item_share=config.max_unknown_item_share,
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
            "audience": config.audience,
            "audience_days": config.audience_days,
            "audience_users": sum(audiences.values()),
            "unknown_item_share": round(max(shares.values(), default=0.0), 6),
            "block_users": block,
            "oom_backoffs": model.block_sizings.ooms,
            **counts,
            **quarantine_metadata([r.shards for r in reports if r.shards is not None]),
        },
    )
    return MaterializeResult(metadata=result.metadata, check_results=checks)


def _score_day(
    run: SpotSafeRun,
    audience: Audience,
    day: DayActivity,
    model: Model,
    version: str,
    config: UserRecommendationsConfig,
    block: int,
    landed: list[str],
    counts: Counter,
    max_quarantine_rate: float,
) -> PartitionReport:
    """Recommends for the day's audience in checkpointed shards of users."""
    store, date, users = run.store, audience.date, audience.users
    # Seen means on any day up to and including this one, so re-running an old partition
    # does not exclude items the user only found later.
    history = [d for d in landed if d <= date]
    seen_users, seen_items = read_interactions(store, history, users=users).pairs
    # Only catalogue items can be recommended or feed the model: the rest need not be held.
    # Sorted by user, so each block of (sorted) users takes one contiguous slice.
    known_items = model.items.index(seen_items) >= 0
    order = np.argsort(seen_users[known_items], kind="stable")
    seen_users, seen_items = seen_users[known_items][order], seen_items[known_items][order]
    known = int((model.users.index(users) >= 0).sum())
    counts.update(
        model_users=known,
        cold_start_users=len(users) - known,
        unknown_items=day.unknown_items,
        unknown_item_interactions=day.unknown_item_interactions,
        interaction_rows=day.rows,
        interaction_rows_used=day.rows_used,
        interaction_rows_quarantined=day.plan.count,
    )

    def transform(batch: pa.RecordBatch, block_users: np.ndarray) -> pa.Table:
        if not len(block_users):
            return RECOMMENDATIONS_SCHEMA.empty_table()
        lo = np.searchsorted(seen_users, block_users[0], "left")
        hi = np.searchsorted(seen_users, block_users[-1], "right")
        mine = (seen_users[lo:hi], seen_items[lo:hi])
        blocks = recommend(model, block_users, mine, config.k, block)
        return pa.Table.from_batches(
            list(_record_batches(blocks, version, counts)), RECOMMENDATIONS_SCHEMA
        )

    everything = np.ones(len(seen_items), bool)
    eligible = eligible_items(users, (seen_users, seen_items), len(model.items), everything)
    plan = user_plan(users, eligible)
    plan.check_rate(max_quarantine_rate, f"{USER_RECOMMENDATIONS} {date}")
    return run.partition(
        USER_RECOMMENDATIONS,
        date,
        RECOMMENDATIONS_SCHEMA,
        [pa.record_batch({"user_id": pa.array(users, pa.int64())})],
        transform,
        prepare=lambda batch: batch["user_id"].to_numpy(),
        batch_size=block,
        inputs=[f for d in history for f in store.landing_files(INTERACTIONS, d)],
        depends_on={
            "model": version,
            "k": config.k,
            "audience": audience.mode,
            "audience_days": audience.days,
        },
        quarantine=plan,
        observe=list_observer(users, eligible, config.k),
        count_out=users_answered,
    )


def _record_batches(
    batches: Iterator[RecommendationBatch], version: str, counts: Counter
) -> Iterator[pa.RecordBatch]:
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
            schema=RECOMMENDATIONS_SCHEMA,
        )
