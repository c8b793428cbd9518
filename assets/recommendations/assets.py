"""Recommendations: landed interactions, the model (EASE or two-tower), nightly top-K lists,
each declared in its own module (``landing.py``, ``model.py``, ``scoring.py``)."""

from assets.recommendations.landing import INTERACTIONS_LANDING, InteractionsConfig, interactions
from assets.recommendations.model import RecommendationModelConfig, recommendation_model
from assets.recommendations.schemas import GROUP
from assets.recommendations.scoring import UserRecommendationsConfig, user_recommendations

__all__ = [
    "GROUP",
    "INTERACTIONS_LANDING",
    "InteractionsConfig",
    "RecommendationModelConfig",
    "UserRecommendationsConfig",
    "interactions",
    "recommendation_model",
    "user_recommendations",
]
