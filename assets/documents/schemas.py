"""The documents dataset's data contract: what the content systems land each day."""

import pyarrow as pa

DATASET = "documents"

DOCUMENTS_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("published_at", pa.timestamp("us", tz="UTC")),
        ("title", pa.string()),
        ("body", pa.string()),
    ]
)
