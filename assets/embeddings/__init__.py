"""The embeddings domain: a search vector for every document of the day (its documents are the
summaries domain's landing dataset)."""

from dagster import Definitions

from assets.embeddings.document_embeddings import document_embeddings

# The checks on document_embeddings are declared on the asset itself (suites/*.json).
defs = Definitions(assets=[document_embeddings])
