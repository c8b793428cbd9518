"""Jobs: one per pipeline (scores, training the model first where none exists) and retraining."""

from __future__ import annotations

from dagster import AssetSelection, define_asset_job

from orchestration.executor import leave_on_interruption_executor
from policy.partitions import daily_partitions
from policy.retries import ERROR_RETRY_POLICY, INTERRUPTION_RETRY_TAGS
from policy.tags import GPU_TAGS
from policy.training import MODELS

PIPELINES: dict[str, list[str]] = {
    "fraud_scoring_job": [
        "transactions",
        "transaction_screens",
        "fraud_model",
        "fraud_scores",
        "fraud_alerts",
    ],
    "recommendations_job": ["interactions", "recommendation_model", "user_recommendations"],
    "daily_summaries_job": ["documents", "document_summaries", "daily_digest"],
    "document_embeddings_job": ["documents", "document_embeddings"],
}

# Which landing dataset feeds which jobs: the landing sensor and the CLI share this. Every job
# that reads a dataset is listed: a late or re-delivered day of documents gets its summaries
# and its embeddings.
LANDING_TRIGGERS: dict[str, tuple[str, ...]] = {
    "transactions": ("fraud_scoring_job",),
    "interactions": ("recommendations_job",),
    "documents": ("daily_summaries_job", "document_embeddings_job"),
}
assert all(d in PIPELINES[j] for d, jobs in LANDING_TRIGGERS.items() for j in jobs)
assert all(any(j in jobs for jobs in LANDING_TRIGGERS.values()) for j in PIPELINES)


def landing_inputs(job_name: str) -> list[str]:
    """The landing datasets a pipeline job reads for its partition."""
    return [dataset for dataset, jobs in LANDING_TRIGGERS.items() if job_name in jobs]


pipeline_jobs = [
    define_asset_job(
        name,
        selection=AssetSelection.assets(*keys),
        partitions_def=daily_partitions,
        op_retry_policy=ERROR_RETRY_POLICY,
        # One process per run: each model loads once, and an interruption is handled by the
        # run-level retry (the node is going away), not by re-running the step in this process.
        executor_def=leave_on_interruption_executor,
        # The daemon relaunches an interrupted run up to the interruption budget (the step tags
        # such runs as retryable; see assets/checkpointing.py).
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
