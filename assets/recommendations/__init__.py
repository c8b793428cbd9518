"""The recommendations domain: interactions, the two-tower model, nightly top-K lists, and the
challenger's user_recommendations_shadow when shadow scoring is on."""

import dagster

from assets.recommendations.assets import interactions, recommendation_model, user_recommendations
from assets.recommendations.demo_data import generate_day as demo_day
from assets.recommendations.shadow import user_recommendations_shadow
from assets.recommendations.training import RECOMMENDATION_GATE
from assets.wiring import DomainWiring, Pipeline, TrainingJob

defs = dagster.Definitions(
    assets=[interactions, recommendation_model, user_recommendations, user_recommendations_shadow],
)

# 03:00 UTC: after fraud, so the GPU node serves one pipeline at a time.
wiring = DomainWiring(
    defs=defs,
    pipelines=(
        Pipeline(
            job="recommendations_job",
            assets=(
                "interactions",
                "recommendation_model",
                "user_recommendations",
                "user_recommendations_shadow",
            ),
            hour_utc=3,
            landing=("interactions",),
            scored="user_recommendations",
        ),
    ),
    training=(
        TrainingJob(
            job="recommendations_training_job",
            model="recommendation_model",
            gate=RECOMMENDATION_GATE,
        ),
    ),
    demo_day=demo_day,
)
