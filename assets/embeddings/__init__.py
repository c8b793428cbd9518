"""The embeddings domain: a search vector for every document of the day (its documents are the
documents dataset, ``assets/documents/``, that the summaries read too)."""

from dagster import Definitions

from assets.embeddings.document_embeddings import document_embeddings
from assets.wiring import DomainWiring, Pipeline

# The checks on document_embeddings are declared on the asset itself (suites/*.json).
defs = Definitions(assets=[document_embeddings])

# 06:00 UTC, last of the night: one encoder pass a document fits the hour before the 07:00
# deadline. Its job includes `documents`, the landing asset it shares with the summaries, so
# that a day of documents landing late or re-delivered gets its embeddings as well as its
# summaries.
wiring = DomainWiring(
    defs=defs,
    pipelines=(
        Pipeline(
            job="document_embeddings_job",
            assets=("documents", "document_embeddings"),
            hour_utc=6,
            landing=("documents",),
            scored="document_embeddings",
        ),
    ),
)
