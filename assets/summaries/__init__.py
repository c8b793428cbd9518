"""The summaries domain: the day's documents, a summary of each, and the topics of the day."""

from dagster import Definitions

from assets.summaries.checks import (
    digest_covers_every_document,
    document_ids_unique,
    summaries_cover_every_document,
    summaries_not_blank,
)
from assets.summaries.digest import daily_digest
from assets.summaries.document_summaries import document_summaries
from assets.summaries.documents import documents

defs = Definitions(
    assets=[documents, document_summaries, daily_digest],
    asset_checks=[
        document_ids_unique,
        summaries_cover_every_document,
        summaries_not_blank,
        digest_covers_every_document,
    ],
)
