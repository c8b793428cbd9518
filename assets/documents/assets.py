"""The day's documents as they land from the content systems: the source of the summaries and
the embeddings."""

from typing import Any

from dagster import AssetExecutionContext, AssetSpec

from assets.days import daily_assets
from assets.documents.gates import DOCUMENT_SUITES, DOCUMENTS_GATE
from assets.documents.quality import screen_documents
from assets.documents.schemas import DATASET, DOCUMENTS_SCHEMA
from assets.landing import LandingSpec, deadline, land
from assets.nightly import Landing
from inference.engine.work import Sizes
from inference.text.documents import SCREEN_COLUMNS
from resources.quality import QualityConfig
from resources.storage import StorageResource


class DocumentsConfig(QualityConfig):
    deadline_hours: float = deadline(5.0, "the summaries schedule runs at 05:00")


@daily_assets(
    AssetSpec(DATASET, group_name="summaries", kinds={"parquet"}),
    checks=[suite.spec() for suite in DOCUMENT_SUITES.values()],
)
def documents(context: AssetExecutionContext, config: DocumentsConfig, storage: StorageResource):
    """Articles published during the day (news, posts, reports): id, publication time, title
    and body text, as landed by the content systems in ``landing/documents/date=D/``.

    Materialising it checks that the day's files exist and carry the columns the summaries need,
    and screens every document (id present and unique, UTF-8 text that is not empty and not too
    long, published inside the day, landed on time); a missing day, a wrong column or too many
    unusable documents fails here, naming the file or the reasons, before any model runs.
    """
    yield from land(context, DOCUMENTS_LANDING, config, storage)


DOCUMENTS_LANDING = LandingSpec(
    DATASET,
    DOCUMENTS_SCHEMA,
    DOCUMENTS_GATE,
    screen=lambda store, date, config, limit: screen_documents(
        store, date, config.check_sample_rows, config.check_seed
    ),
    config=DocumentsConfig,
)

# The day's documents as the summaries and the embeddings read them (the public module's
# Landing): this asset, its screening (no or repeated id, no text, not UTF-8, too long,
# published outside the day), and only the columns they read.
DOCUMENTS_INPUT = Landing(
    DATASET,
    DOCUMENTS_SCHEMA,
    key="doc_id",
    asset=documents,
    screen=lambda store, date: screen_documents(store, date).plan,
    columns=SCREEN_COLUMNS,
)


def document_sizes(config: Any) -> Sizes:
    """Documents per model step and per checkpointed shard, from a documents pipeline's config
    (its ``docs_per_chunk`` and ``docs_per_shard``)."""
    return Sizes(batch_size=config.docs_per_chunk, shard_rows=config.docs_per_shard)
