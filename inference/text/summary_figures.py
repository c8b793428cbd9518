"""The summaries' exact figures as plain functions, read by the checks on the summaries, and
the text a document is summarised from.

While the documents stream through the model, :func:`summary_observer` checks every summary
against its document: not blank, not longer than the document, within the hard length cap, and
drawn from it (extractive: the sentences the summariser recorded, by their offsets, are
sentences of the normalised document, and the summary is exactly their join; abstractive: most
of its words occur in the document). Which documents are screened out before is the documents'
own (``inference/text/documents.py``); no Dagster here.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inference.engine.invariants import StreamStats
from inference.engine.quarantine import is_blank_text
from inference.text.normalise import normalise_text
from inference.text.segment import LengthCap, join_sentences, measure, sentence_spans, within_cap

# Abstractive summaries may paraphrase; at least this share of their words must occur in the
# document for the summary to count as grounded in it.
MIN_GROUNDED_WORDS = 0.6
_WORD = re.compile(r"\w+")


def document_text(title: str | None, body: str | None) -> str:
    """The text a document is summarised from: its body, or its title when the body is blank
    (as the screening judges it: whitespace and zero-width characters only)."""
    return (title or "") if is_blank_text(body) else (body or "")


def summary_texts(batch: pa.RecordBatch) -> list[str]:
    """The texts a batch of documents (``title`` and ``body`` columns) is summarised from."""
    titles, bodies = batch.column("title").to_pylist(), batch.column("body").to_pylist()
    return [document_text(t, b) for t, b in zip(titles, bodies, strict=True)]


def summary_observer(version: str, extractive: bool, cap: LengthCap):
    """Exact statistics of ``document_summaries`` batches against the documents they summarise,
    and against the hard length cap."""

    def observe(scored: pa.RecordBatch, out: pa.Table, stats: StreamStats) -> None:
        texts = summary_texts(scored)
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
