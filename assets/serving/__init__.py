"""Serving: the publish steps that load each scored day into the serving store the product
reads (docs/serving.md). Not a scoring domain: it scores nothing and lands nothing; each publish
asset follows one pipeline's scored output."""

from dataclasses import dataclass

import dagster

from assets.serving.assets import (
    PUBLISHED,
    document_embeddings_serving,
    fraud_alerts_serving,
    user_recommendations_serving,
)


@dataclass(frozen=True)
class Publish:
    """A publish job: ``asset`` (a publish asset) run after the pipeline job ``after``."""

    job: str
    asset: str
    after: str


PUBLISH_JOBS: tuple[Publish, ...] = (
    Publish(job="fraud_serving_job", asset="fraud_alerts_serving", after="fraud_scoring_job"),
    Publish(
        job="recommendations_serving_job",
        asset="user_recommendations_serving",
        after="recommendations_job",
    ),
    Publish(
        job="embeddings_serving_job",
        asset="document_embeddings_serving",
        after="document_embeddings_job",
    ),
)

defs = dagster.Definitions(
    assets=[fraud_alerts_serving, user_recommendations_serving, document_embeddings_serving]
)

__all__ = [
    "PUBLISHED",
    "PUBLISH_JOBS",
    "Publish",
    "defs",
    "document_embeddings_serving",
    "fraud_alerts_serving",
    "user_recommendations_serving",
]
