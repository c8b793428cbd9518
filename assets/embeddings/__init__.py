"""The embeddings domain: a search vector for every document of the day (its documents are the
documents dataset, ``assets/documents/``, that the summaries read too)."""

from assets.embeddings.document_embeddings import PIPELINE

# The checks on document_embeddings are declared on the asset itself (suites/*.json); its job,
# document_embeddings_job, includes the documents landing asset the summaries' wiring registers.
wiring = PIPELINE.wiring
defs = wiring.defs
