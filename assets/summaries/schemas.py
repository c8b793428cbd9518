"""The summaries domain's data contracts: the landing dataset and the published outputs."""

import pyarrow as pa

DATASET = "documents"
SUMMARIES = "document_summaries"

DOCUMENTS_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("published_at", pa.timestamp("us", tz="UTC")),
        ("title", pa.string()),
        ("body", pa.string()),
    ]
)
