"""The fraud domain: transactions -> fraud_model -> fraud_scores -> fraud_alerts, and the
challenger's fraud_scores_shadow when shadow scoring is on."""

import dagster

from assets.fraud.assets import (
    fraud_alerts,
    fraud_model,
    fraud_model_auprc_above_floor,
    fraud_scores,
    transactions,
)
from assets.fraud.demo_data import generate_day as demo_day
from assets.fraud.pipeline import FRAUD_GATE
from assets.fraud.shadow import fraud_scores_shadow
from assets.wiring import DomainWiring, Pipeline, TrainingJob

defs = dagster.Definitions(
    assets=[transactions, fraud_model, fraud_scores, fraud_alerts, fraud_scores_shadow],
    asset_checks=[fraud_model_auprc_above_floor],
)

# Fraud runs first of the night (02:00 UTC): its alerts are the most urgent output.
wiring = DomainWiring(
    defs=defs,
    pipelines=(
        Pipeline(
            job="fraud_scoring_job",
            assets=(
                "transactions",
                "transaction_screens",
                "fraud_model",
                "fraud_scores",
                "fraud_alerts",
                "fraud_scores_shadow",
            ),
            hour_utc=2,
            landing=("transactions",),
            scored="fraud_scores",
        ),
    ),
    training=(TrainingJob(job="fraud_training_job", model="fraud_model", gate=FRAUD_GATE),),
    demo_day=demo_day,
)

__all__ = ["defs", "fraud_alerts", "fraud_model", "fraud_scores", "transactions", "wiring"]
