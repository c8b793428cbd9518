"""The documents' screening as plain functions: which documents cannot be read, and why.

Documents that cannot be summarised or embedded — no id, a repeated id, text that is not UTF-8,
no text at all, text too long to read in reasonable time, or a publication time outside the day
— are quarantined with their reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from assets.documents.schemas import DATASET, DOCUMENTS_SCHEMA
from assets.gates import day_bounds, landed_rows
from inference.engine.quarantine import (
    QuarantinePlan,
    Screener,
    blank,
    invalid_utf8,
    is_null,
    longer_than,
    outside,
)
from resources.quality import PositionCursor, sample_positions
from resources.storage import DataStore

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
QUARANTINED_REASONS = {
    "document_ids_present_and_unique": ("null_doc_id", "duplicate_doc_id"),
    "document_texts_usable": REASONS[1:6],
}


@dataclass
class DocumentScreen:
    """What the screening pass found in one day of documents."""

    plan: QuarantinePlan
    figures: dict[str, Any]
    sample: pa.Table


def screen_documents(store: DataStore, date: str, sample_rows: int = 0, seed: int = 0):
    """Screens one day of documents: quarantine plan, exact figures and a seeded sample.

    Raises:
        LandingDataError: the partition is missing, unreadable, malformed or empty.
    """
    day = day_bounds(date, DOCUMENTS_SCHEMA.field("published_at").type)
    rows = landed_rows(store, DATASET, date, DOCUMENTS_SCHEMA, noun="documents")
    sampler = PositionCursor(sample_positions(rows, sample_rows, seed))
    screener, sampled = Screener(), []
    for batch in store.iter_landing(DATASET, date, DOCUMENTS_SCHEMA, SCREEN_COLUMNS):
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
        local = sampler.advance(batch.num_rows)
        if len(local):
            sampled.append(batch.select(["doc_id", "published_at", "title"]).take(pa.array(local)))
    plan = screener.plan()
    figures = {
        "rows": rows,
        "rows_quarantined": plan.count,
        **dict.fromkeys(REASONS, 0),
        **plan.counts(),
    }
    schema = pa.schema([DOCUMENTS_SCHEMA.field(c) for c in ("doc_id", "published_at", "title")])
    return DocumentScreen(plan, figures, pa.Table.from_batches(sampled, schema=schema))
