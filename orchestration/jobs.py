"""Jobs: one per pipeline (scores, training the model first where none exists) and retraining."""

from __future__ import annotations

from dagster import (
    AssetSelection,
    Backoff,
    Jitter,
    RetryPolicy,
    define_asset_job,
)

from orchestration.automation import GPU_TAGS
from orchestration.executor import leave_on_interruption_executor
from orchestration.partitions import daily_partitions
from resources.inference import DEFAULT_INTERRUPTION_BUDGET

# Errors in user code (bad model, bad data) get a small budget with backoff, then fail loudly.
# Errors that a retry cannot fix (a missing landing partition) raise Failure(allow_retries=False).
ERROR_RETRY_POLICY = RetryPolicy(
    max_retries=2, delay=5, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS
)

# Interruptions have their own, larger budget: the daemon relaunches an interrupted run up to
# this many times (the step tags such runs as retryable; see assets/checkpointing.py).
INTERRUPTION_RETRY_TAGS = {"dagster/max_retries": str(DEFAULT_INTERRUPTION_BUDGET)}

PIPELINES: dict[str, list[str]] = {
    "fraud_scoring_job": ["transactions", "fraud_model", "fraud_scores", "fraud_alerts"],
    "recommendations_job": ["interactions", "recommendation_model", "user_recommendations"],
    "daily_summaries_job": ["documents", "document_summaries", "daily_digest"],
}

# Which landing dataset feeds which job: the landing sensor and the CLI share this.
LANDING_TRIGGERS: dict[str, str] = {
    "transactions": "fraud_scoring_job",
    "interactions": "recommendations_job",
    "documents": "daily_summaries_job",
}

MODELS: dict[str, str] = {
    "fraud_training_job": "fraud_model",
    "recommendations_training_job": "recommendation_model",
}

pipeline_jobs = [
    define_asset_job(
        name,
        selection=AssetSelection.assets(*keys),
        partitions_def=daily_partitions,
        op_retry_policy=ERROR_RETRY_POLICY,
        # One process per run: each model loads once, and an interruption is handled by the
        # run-level retry (the node is going away), not by re-running the step in this process.
        executor_def=leave_on_interruption_executor,
        tags={**GPU_TAGS, **INTERRUPTION_RETRY_TAGS},
        description=f"Scores one day (or a range in one run): {', '.join(keys)}.",
    )
    for name, keys in PIPELINES.items()
]

training_jobs = [
    define_asset_job(
        name,
        selection=AssetSelection.assets(model),
        config={"ops": {model: {"config": {"retrain": True}}}},
        op_retry_policy=ERROR_RETRY_POLICY,
        tags=GPU_TAGS,
        description=f"Retrains {model} from the labelled history on demand and makes it current.",
    )
    for name, model in MODELS.items()
]
