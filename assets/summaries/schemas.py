"""The summaries domain's data contract: the published output (its input is the documents
dataset, ``assets/documents/schemas.py``)."""

SUMMARIES = "document_summaries"
