"""Summaries data quality as plain functions: which documents cannot be summarised, and the
exact figures the checks on the summaries read.

Documents that cannot be summarised — no id, a repeated id, text that is not UTF-8, no text at
all, text too long to summarise in reasonable time, or a publication time outside the day —
are quarantined with their reason. While the rest stream through the model,
:func:`summary_observer` checks every summary against its document: not blank, not longer than
the document, within the hard length cap, and drawn from it (extractive: the sentences the
summariser recorded, by their offsets, are sentences of the normalised document, and the summary
is exactly their join; abstractive: most of its words occur in the document).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from assets.gates import day_bounds, landed_rows
from assets.summaries.schemas import DATASET, DOCUMENTS_SCHEMA
from inference.engine.invariants import StreamStats
from inference.engine.quarantine import (
    QuarantinePlan,
    Screener,
    blank,
    invalid_utf8,
    is_blank_text,
    is_null,
    longer_than,
    outside,
)
from inference.text.normalise import normalise_text
from inference.text.segment import LengthCap, join_sentences, measure, sentence_spans, within_cap
from resources.quality import PositionCursor, sample_positions
from resources.storage import DataStore

# About 30,000 words: longer texts are dumps, logs or concatenated feeds rather than articles,
# and embedding their thousands of sentences would take minutes of a nightly run each.
MAX_DOCUMENT_BYTES = 256 * 1024
# Abstractive summaries may paraphrase; at least this share of their words must occur in the
# document for the summary to count as grounded in it.
MIN_GROUNDED_WORDS = 0.6
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
_WORD = re.compile(r"\w+")


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


def document_text(title: str | None, body: str | None) -> str:
    """The text a document is summarised from: its body, or its title when the body is blank
    (as the screening judges it: whitespace and zero-width characters only)."""
    return (title or "") if is_blank_text(body) else (body or "")


def summary_observer(version: str, extractive: bool, cap: LengthCap):
    """Exact statistics of ``document_summaries`` batches against the documents they summarise,
    and against the hard length cap."""

    def observe(scored: pa.RecordBatch, out: pa.Table, stats: StreamStats) -> None:
        texts = [
            document_text(t, b)
            for t, b in zip(scored["title"].to_pylist(), scored["body"].to_pylist(), strict=True)
        ]
        summaries = out["summary"].to_pylist()
        spans = out["sentence_spans"].to_pylist()
        blank_count = not_shorter = ungrounded = over_cap = 0
        longest = [0]
        for text, summary, places in zip(texts, summaries, spans, strict=True):
            if not summary or not summary.strip():
                blank_count += 1
                continue
            size = measure(summary)
            longest.append(size.sentences)
            if not within_cap(summary, cap):
                over_cap += 1
            if len(summary) > len(text):
                not_shorter += 1
            if not _drawn_from(summary, places, text, extractive):
                ungrounded += 1
        stats.count("summary_blank", blank_count)
        stats.count("summary_longer_than_document", not_shorter)
        stats.count("summary_not_drawn_from_document", ungrounded)
        stats.count("summary_over_length_cap", over_cap)
        stats.extremes("summary_sentences", np.array(longest))
        wrong = pc.fill_null(pc.not_equal(out["model_version"], version), True)
        stats.count("model_version_missing", int(pc.sum(wrong).as_py() or 0))
        same = out["doc_id"].equals(pa.chunked_array([scored["doc_id"]]))
        stats.count("ids_not_passed_through", 0 if same else len(summaries))
        stats.count("doc_id_null", out["doc_id"].null_count)

    return observe


def _drawn_from(summary: str, spans: list[dict] | None, text: str, extractive: bool) -> bool:
    """Whether a summary is its document's text: extractive, by the sentences it recorded;
    abstractive, by the share of its words the document has."""
    if extractive:
        return _recorded_sentences_match(summary, spans, normalise_text(text))
    words = _WORD.findall(summary.lower())
    if not words:
        return False
    known = set(_WORD.findall(text.lower()))
    return sum(w in known for w in words) / len(words) >= MIN_GROUNDED_WORDS


def _recorded_sentences_match(summary: str, spans: list[dict] | None, flat: str) -> bool:
    """The summariser's record checked against the text it read (markup removed, NFC,
    whitespace): each span is one of the document's sentences, in order and apart, or, alone,
    the prefix of one (a sentence longer than the cap); and the summary is their join.

    The summary is never segmented again: a sentence that starts in lower case (a quotation's
    second half, "iPhone", a list item) may not be cut where the summariser cut it.
    """
    if not spans:
        return False
    places = [(int(s["start"]), int(s["end"])) for s in spans]
    sentences = dict(sentence_spans(flat))
    previous_end = 0
    for start, end in places:
        whole = sentences.get(start)
        if whole is None or start < previous_end or not start < end <= whole:
            return False
        if end < whole and len(places) > 1:
            return False
        previous_end = end
    return summary == join_sentences([flat[a:b] for a, b in places])
