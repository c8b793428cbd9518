"""``user_recommendations_shadow``: the recommender's challenger ranks each night's audience
beside the champion (assets/shadow/), agreeing on each user's top-K."""

from assets.recommendations.schemas import RECOMMENDATION_MODEL
from assets.recommendations.scoring import USER_RECOMMENDATIONS_SPEC, UserRecommendationsConfig
from assets.shadow.asset import Shadow, shadow_asset
from inference.models.agreement import Limit, topk_agreement

RECOMMENDATION_SHADOW_LIMITS = (
    # Both rank the same audience: a user only one version ranked is a fault.
    Limit("users_unmatched", at_most=0),
    # On average at least half of a user's list is kept: a retrain refreshes lists, it does
    # not replace them.
    Limit("mean_topk_overlap", at_least=0.5),
)

RECOMMENDATION_SHADOW = Shadow(
    scoring=USER_RECOMMENDATIONS_SPEC,
    model=RECOMMENDATION_MODEL,
    config=UserRecommendationsConfig,
    agreement=topk_agreement,
    limits=RECOMMENDATION_SHADOW_LIMITS,
    group="recommendations",
)
user_recommendations_shadow = shadow_asset(RECOMMENDATION_SHADOW)
