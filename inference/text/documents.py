"""Which landed documents can be read: the screening rules over one record batch.

Documents that cannot be summarised or embedded — no id, a repeated id, text that is not UTF-8,
no text at all, text too long to read in reasonable time, or a publication time outside the day
— are quarantined with their reason. The documents are one dataset that the summaries and the
embeddings share, so their rules live beside the text compute both use; streaming a day's
batches out of storage into them is the documents asset's own. No Dagster and no data access
here.
"""

from __future__ import annotations

import pyarrow as pa

from inference.engine.quarantine import (
    Screener,
    blank,
    invalid_utf8,
    is_null,
    longer_than,
    outside,
)

# About 30,000 words: longer texts are dumps, logs or concatenated feeds rather than articles,
# and embedding their thousands of sentences would take minutes of a nightly run each.
MAX_DOCUMENT_BYTES = 256 * 1024
SCREEN_COLUMNS = ["doc_id", "published_at", "title", "body"]
REASONS = (
    "null_doc_id",
    "invalid_utf8",
    "empty_text",
    "text_too_long",
    "null_published_at",
    "published_outside_day",
    "duplicate_doc_id",
)


def screen_batch(
    screener: Screener, batch: pa.RecordBatch, day: tuple[pa.Scalar, pa.Scalar]
) -> None:
    """Screens the next batch of a day's documents, in the order of :data:`REASONS`.

    Args:
        screener: the day's screening so far; a repeated id is found across its batches.
        batch: the documents' :data:`SCREEN_COLUMNS`.
        day: the partition's day, [midnight, next midnight), as scalars of ``published_at``'s
            type.
    """
    title, body = batch["title"], batch["body"]
    broken = invalid_utf8(title) | invalid_utf8(body)
    screener.add(
        batch.num_rows,
        {
            "null_doc_id": is_null(batch["doc_id"]),
            "invalid_utf8": broken,
            "empty_text": blank(body, ~broken) & blank(title, ~broken),
            "text_too_long": longer_than(body, MAX_DOCUMENT_BYTES),
            "null_published_at": is_null(batch["published_at"]),
            "published_outside_day": outside(batch["published_at"], *day),
        },
    )
    screener.keys(batch["doc_id"], "duplicate_doc_id")
