"""The recommendations domain: interactions, the two-tower model, nightly top-K lists."""

import dagster

from assets.recommendations.assets import interactions, recommendation_model, user_recommendations
from assets.recommendations.checks import RECOMMENDATION_CHECKS

defs = dagster.Definitions(
    assets=[interactions, recommendation_model, user_recommendations],
    asset_checks=RECOMMENDATION_CHECKS,
)
