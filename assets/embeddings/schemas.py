"""The embeddings domain's data contract: the published ``document_embeddings`` partition."""

import pyarrow as pa

EMBEDDINGS = "document_embeddings"
# all-MiniLM-L6-v2's width, then the document's hashed words (inference.text.chunks.Chunking's
# default terms): the column is a fixed-size list, so a vector of any other length cannot be
# written, and a different encoder or bucket count is a contract change rather than a silent one.
DIMENSION = 384 + 1024

EMBEDDINGS_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("embedding", pa.list_(pa.float32(), DIMENSION)),
        ("model_version", pa.string()),
    ]
)
