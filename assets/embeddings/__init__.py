"""The embeddings domain: a search vector for every document of the day (its documents are the
documents dataset, ``assets/documents/``, that the summaries read too)."""

from assets.embeddings.document_embeddings import PIPELINE, document_embeddings
from assets.wiring import DomainWiring

__all__ = ["defs", "document_embeddings", "wiring"]

# As nightly declared it: the scoring asset with its checks (suites/*.json), and
# document_embeddings_job, which includes the documents landing asset the summaries' wiring
# registers. Its landing dataset is the summaries', so it writes no demo day of its own.
defs = PIPELINE.wiring.defs
wiring = DomainWiring(defs, PIPELINE.wiring.pipelines)
