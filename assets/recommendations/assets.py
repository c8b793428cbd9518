"""Recommendations: landed interactions, the model (EASE or two-tower), nightly top-K lists."""

from typing import Literal

from dagster import (
    AssetExecutionContext,
    AssetSpec,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)
from pydantic import Field

from assets.days import daily_assets
from assets.errors import fail_fast_on_bad_input
from assets.landing import LandingSpec, deadline, land
from assets.model_asset import champion_data_version
from assets.recommendations.gates import (
    INTERACTION_SUITES,
    INTERACTIONS_GATE,
)
from assets.recommendations.quality import (
    INTERACTIONS_QUARANTINE,
    QUARANTINE_SCHEMA,
    screen_interactions,
)
from assets.recommendations.schemas import (
    INTERACTIONS,
    INTERACTIONS_SCHEMA,
    RECOMMENDATION_MODEL,
)
from assets.recommendations.scoring import USER_RECOMMENDATIONS_SPEC, UserRecommendationsConfig
from assets.recommendations.training import (
    current_model,
    train_and_save,
)
from assets.runner import score, scoring_asset
from inference.models.modelstore import ModelNotFoundError
from inference.recs.ease import DEFAULT_L2, DEFAULT_MAX_ITEMS, EaseConfig
from inference.recs.two_tower import TrainConfig
from policy.automation import GPU_POOL
from resources.inference import InferenceResource
from resources.quality import QualityConfig
from resources.storage import DataStore, StorageResource

GROUP = "recommendations"


class InteractionsConfig(QualityConfig):
    deadline_hours: float = deadline(3.0, "the recommendations schedule runs at 03:00")


@daily_assets(
    AssetSpec(INTERACTIONS, group_name=GROUP, kinds={"parquet"}),
    checks=[suite.spec() for suite in INTERACTION_SUITES.values()],
)
def interactions(
    context: AssetExecutionContext, config: InteractionsConfig, storage: StorageResource
):
    """Every view, click and purchase users made on the catalogue during one UTC day, as
    landed by the event pipeline. Materialising it checks each file against the contract
    (user_id, item_id, ts, event, weight; no interaction without its ids), counts the day's
    events, and warns when events fall outside the day or the day landed late. A row with an
    unknown event type or a null, non-finite or negative weight is quarantined to
    `interactions_quarantine` with its reason and never used as history; above the quarantine
    limit the day's check fails, naming the rate and the top reasons."""
    yield from land(context, INTERACTIONS_LANDING, config, storage)


def _screen(store: DataStore, date: str, config: InteractionsConfig, limit: float):
    return screen_interactions(
        store, date, config.check_sample_rows, config.check_seed, max_rate=limit
    )


def _publish_quarantine(store: DataStore, date: str, screen, config, limit: float) -> dict:
    """The day's unusable rows, with their reasons, in ``interactions_quarantine``."""
    plan = screen.plan
    metadata = {
        "rows_used": screen.figures["rows_used"],
        "rows_quarantined": plan.count,
        "quarantine_rate": round(plan.count / max(1, plan.rows), 6),
    }
    if screen.quarantined is not None and not limit.exceeded(plan.count, plan.rows):
        # Published even when empty, so a re-run after a fix replaces yesterday's rows.
        held = store.publish(INTERACTIONS_QUARANTINE, date, [screen.quarantined], QUARANTINE_SCHEMA)
        metadata["quarantine"] = MetadataValue.path(held.uri)
    return {INTERACTIONS: metadata}


INTERACTIONS_LANDING = LandingSpec(
    INTERACTIONS,
    INTERACTIONS_SCHEMA,
    INTERACTIONS_GATE,
    screen=_screen,
    publish=_publish_quarantine,
    config=InteractionsConfig,
)


class RecommendationModelConfig(Config):
    retrain: bool = Field(default=False, description="Train even if a current model exists.")
    model: Literal["ease", "two_tower"] = Field(
        default="ease",
        description="ease: closed-form item-item model (best measured on MovieLens 100k, see "
        "evaluation/recommendations.py); two_tower: learned user and item embeddings.",
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
    """What each user is likely to want next, learned from the days of interactions landed so
    far (quarantined rows left out): by default EASE, which scores each item by how strongly
    the items a user already took predict it; or a two-tower embedding model. The first model
    learns from every day and becomes the champion; a retrain holds out the newest days after
    the champion's last training day for the promotion gate, learns from the days before them
    and waits as the challenger (assets/promotion.py). Quality is recall@20 on the held-out
    day, next to recommending the most popular items. The champion is reused unless `retrain`
    is set."""
    store = storage.store()
    # A current model whose files are damaged fails at once (see fraud_model).
    with fail_fast_on_bad_input():
        if not config.retrain:
            try:
                trained = current_model(store)
                context.log.info(f"reusing {RECOMMENDATION_MODEL} {trained.version}")
                return MaterializeResult(
                    metadata=trained.metadata(reused=True),
                    data_version=champion_data_version(store, RECOMMENDATION_MODEL),
                )
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
    # A challenger waiting for the gate changes nothing downstream (assets/model_asset.py).
    return MaterializeResult(
        metadata=trained.metadata(reused=False),
        data_version=champion_data_version(store, RECOMMENDATION_MODEL),
    )


@scoring_asset(USER_RECOMMENDATIONS_SPEC, deps=[interactions, recommendation_model], group=GROUP)
def user_recommendations(
    context: AssetExecutionContext,
    config: UserRecommendationsConfig,
    storage: StorageResource,
    inference: InferenceResource,
):
    """The top-K items to show each user of the day's audience, best first, never an item they
    have already interacted with. The audience is every user seen within the trailing
    `audience_days` (or every user ever seen, with `audience: all`), so a user who was not
    active that day still gets a fresh list from the current model and catalogue. Users the
    model cannot rank (no history in its catalogue) get the most popular items they have not
    seen (counted as popularity_ranked_users). A user who has already seen every item is
    quarantined to `user_recommendations_quarantine` rather than silently left out."""
    yield from score(context, USER_RECOMMENDATIONS_SPEC, config, storage, inference)
