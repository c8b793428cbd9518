"""The summaries domain: the day's documents, a summary of each, and the topics of the day.

The documents dataset has its own home (``assets/documents/``), since the embeddings read it
too; this domain registers its landing asset and demo day, its job being the first to land it.
"""

from dagster import Definitions

from assets.documents.assets import documents
from assets.documents.demo_data import generate_day as demo_day
from assets.summaries.checks import digest_covers_every_document
from assets.summaries.digest import daily_digest
from assets.summaries.document_summaries import document_summaries
from assets.wiring import DomainWiring, Pipeline

# The checks on documents and document_summaries are declared on the assets themselves (suites
# in assets/documents/suites/ and assets/summaries/suites/); only the digest's is a separate
# definition.
defs = Definitions(
    assets=[documents, document_summaries, daily_digest],
    asset_checks=[digest_covers_every_document],
)

# 05:00 UTC: the morning digest is read after 07:00, and documents land by 05:00. The job is
# the domain's, not the one nightly declares for document_summaries alone: it lands the
# documents and runs the digest downstream too.
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
