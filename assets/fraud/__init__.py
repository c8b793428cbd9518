"""The fraud domain: transactions -> fraud_model -> fraud_scores -> fraud_alerts."""

import dagster

from assets.fraud.assets import fraud_alerts, fraud_model, fraud_scores, transactions
from assets.fraud.checks import fraud_model_auprc_above_floor

defs = dagster.Definitions(
    assets=[transactions, fraud_model, fraud_scores, fraud_alerts],
    asset_checks=[fraud_model_auprc_above_floor],
)

__all__ = ["defs", "fraud_alerts", "fraud_model", "fraud_scores", "transactions"]
