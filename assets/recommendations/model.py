"""``recommendation_model``: the recommender the nightly lists are ranked with, trained once
and reused, or retrained to wait for the promotion gate as the challenger."""

from typing import Literal

from dagster import AssetExecutionContext, Config, Failure, MaterializeResult, asset
from pydantic import Field

from assets.errors import fail_fast_on_bad_input
from assets.model_asset import champion_data_version
from assets.recommendations.landing import interactions
from assets.recommendations.schemas import GROUP, INTERACTIONS, RECOMMENDATION_MODEL
from assets.recommendations.training import current_model, train_and_save
from inference.models.modelstore import ModelNotFoundError
from inference.recs.ease import DEFAULT_L2, DEFAULT_MAX_ITEMS, EaseConfig
from inference.recs.two_tower import TrainConfig
from policy.automation import GPU_POOL
from resources.inference import InferenceResource
from resources.storage import StorageResource


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
