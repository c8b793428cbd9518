"""The summaries domain: the day's documents, a summary of each, and the topics of the day."""

from dagster import Definitions

from assets.summaries.checks import digest_covers_every_document
from assets.summaries.demo_data import generate_day as demo_day
from assets.summaries.digest import daily_digest
from assets.summaries.document_summaries import document_summaries
from assets.summaries.documents import documents
from assets.wiring import DomainWiring, Pipeline

# The checks on documents and document_summaries are declared on the assets themselves
# (suites in assets/summaries/suites/); only the digest's is a separate definition.
defs = Definitions(
    assets=[documents, document_summaries, daily_digest],
    asset_checks=[digest_covers_every_document],
)

# 05:00 UTC: the morning digest is read after 07:00, and documents land by 05:00.
wiring = DomainWiring(
    defs=defs,
    pipelines=(
        Pipeline(
            job="daily_summaries_job",
            assets=("documents", "document_summaries", "daily_digest"),
            hour_utc=5,
            landing=("documents",),
            scored="document_summaries",
        ),
    ),
    demo_day=demo_day,
)
