"""Jobs: one per domain pipeline (scores, training the model first where none exists) and one per
training job, built from the domains' wiring with the cross-cutting policy applied once."""

from __future__ import annotations

from collections.abc import Sequence

from dagster import AssetSelection, define_asset_job

from assets.domains import PIPELINES as DOMAIN_PIPELINES
from assets.domains import TRAINING_JOBS
from assets.wiring import Pipeline, TrainingJob
from orchestration.executor import leave_on_interruption_executor
from policy.partitions import daily_partitions
from policy.retries import ERROR_RETRY_POLICY, INTERRUPTION_RETRY_TAGS
from policy.tags import GPU_TAGS

# Pipeline job -> the assets it materialises, in the domains' order.
PIPELINES: dict[str, list[str]] = {p.job: list(p.assets) for p in DOMAIN_PIPELINES}


def landing_triggers(pipelines: Sequence[Pipeline]) -> dict[str, tuple[str, ...]]:
    """Landing dataset -> the pipeline jobs that read it, in the pipelines' order."""
    triggers: dict[str, tuple[str, ...]] = {}
    for pipeline in pipelines:
        for dataset in pipeline.landing:
            triggers[dataset] = (*triggers.get(dataset, ()), pipeline.job)
    return triggers


# Which landing dataset feeds which jobs: the landing sensor and the CLI share this. Every job
# that reads a dataset is listed: a late or re-delivered day of documents gets its summaries
# and its embeddings.
LANDING_TRIGGERS: dict[str, tuple[str, ...]] = landing_triggers(DOMAIN_PIPELINES)


def landing_inputs(job_name: str) -> list[str]:
    """The landing datasets a pipeline job reads for its partition."""
    return [dataset for dataset, jobs in LANDING_TRIGGERS.items() if job_name in jobs]


def pipeline_job(pipeline: Pipeline):
    """A domain's nightly job, with the retry policy, tags and executor every pipeline gets."""
    return define_asset_job(
        pipeline.job,
        selection=AssetSelection.assets(*pipeline.assets),
        partitions_def=daily_partitions,
        op_retry_policy=ERROR_RETRY_POLICY,
        # One process per run: each model loads once, and an interruption is handled by the
        # run-level retry (the node is going away), not by re-running the step in this process.
        executor_def=leave_on_interruption_executor,
        # The daemon relaunches an interrupted run up to the interruption budget (the step tags
        # such runs as retryable; see assets/checkpointing.py).
        tags={**GPU_TAGS, **INTERRUPTION_RETRY_TAGS},
        description=f"Scores one day (or a range in one run): {', '.join(pipeline.assets)}.",
    )


def training_job(training: TrainingJob):
    """A domain's on-demand retraining job: its model asset, with ``retrain: true``."""
    model = training.model
    return define_asset_job(
        training.job,
        selection=AssetSelection.assets(model),
        config={"ops": {model: {"config": {"retrain": True}}}},
        op_retry_policy=ERROR_RETRY_POLICY,
        tags=GPU_TAGS,
        description=f"Retrains {model} from the labelled history on demand into a challenger; "
        "its promotion gate, or `nightshift promote`, makes it the champion.",
    )


pipeline_jobs = [pipeline_job(p) for p in DOMAIN_PIPELINES]
training_jobs = [training_job(t) for t in TRAINING_JOBS]
