"""The documents' screening pass: a landed day streamed through the rules of
``inference/text/documents.py`` (no id, a repeated id, text that is not UTF-8, no text, text
too long, a publication time outside the day), counted by reason and sampled for the checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from assets.documents.schemas import DATASET, DOCUMENTS_SCHEMA
from assets.gates import day_bounds, landed_rows
from inference.engine.quarantine import QuarantinePlan, Screener
from inference.text.documents import REASONS, SCREEN_COLUMNS, screen_batch
from resources.quality import PositionCursor, sample_positions
from resources.storage import DataStore

# Which landing check each quarantine reason belongs to (shown as counts in its metadata).
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
        screen_batch(screener, batch, day)
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
