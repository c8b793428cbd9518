"""The summaries domain's data contract: the published output (its input is the documents
dataset, ``assets/documents/schemas.py``)."""

import pyarrow as pa

SUMMARIES = "document_summaries"

# Where an extractive summary's sentences lie: character offsets into the document's normalised
# text, recorded as the summariser chose them (null for abstractive summaries, which are written).
SENTENCE_SPANS = pa.list_(pa.struct([("start", pa.int32()), ("end", pa.int32())]))
# The model version before the spans: the column order the table has always had.
SUMMARIES_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("summary", pa.string()),
        ("model_version", pa.string()),
        ("sentence_spans", SENTENCE_SPANS),
    ]
)
