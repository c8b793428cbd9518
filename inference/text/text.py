"""Extractive summaries: each document's best-ranked sentences, in document order, under a cap.

The sentence encoder (:mod:`inference.text.encoder`), embeddings (:mod:`inference.text.embeddings`) and
topics (:mod:`inference.text.topics`) live in their own modules; import them from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from inference.text.embeddings import Embeddings, encode
from inference.text.encoder import SentenceEncoder
from inference.text.normalise import normalise_text
from inference.text.rank import RankerSettings, encoder_can_read, rank_sentences
from inference.text.segment import LengthCap, fit_to_cap, join_sentences, sentence_spans, truncate

if TYPE_CHECKING:
    import torch

__all__ = [
    "ExtractiveSummary",
    "extractive_summaries",
    "summarise_sentences",
    "summary_length",
    "summary_spans",
]


def summary_length(sentences: int, max_sentences: int = 3) -> int:
    """How many sentences to keep: the cap's count, or every sentence of a shorter text.

    A share of the text (a fifth, say) would leave a six-sentence page with one sentence, often
    its heading; the cap is what a reader is promised, so a text that has that many sentences
    gets that many, while they fit the cap's words.
    """
    return max(0, min(max_sentences, sentences))


class ExtractiveSummary(str):
    """A summary made of its document's sentences, with where each lies in the document.

    It is the summary text itself; ``spans`` are the selected sentences' ``(start, end)``
    character offsets into the normalised document text (:func:`inference.text.normalise.
    normalise_text`), in document order, recorded as they are chosen, so a check can verify
    what the summariser did rather than segment the summary again.
    """

    spans: tuple[tuple[int, int], ...]

    def __new__(cls, text: str, spans: Sequence[tuple[int, int]]) -> ExtractiveSummary:
        summary = super().__new__(cls, text)
        summary.spans = tuple((int(a), int(b)) for a, b in spans)
        return summary

    def __reduce__(self):
        # str's own pickling would rebuild the text alone; shard workers may ship summaries.
        return (ExtractiveSummary, (str(self), self.spans))


def summary_spans(summary: str) -> tuple[tuple[int, int], ...] | None:
    """The recorded sentence offsets of an extractive summary; None for any other text."""
    return summary.spans if isinstance(summary, ExtractiveSummary) else None


def span_records(summary: str) -> list[dict[str, int]] | None:
    """A summary's recorded sentence offsets as ``{"start", "end"}`` records, the values of a
    list-of-structs column; None when it has no record."""
    spans = summary_spans(summary)
    return None if spans is None else [{"start": a, "end": b} for a, b in spans]


def extractive_summaries(
    encoder: SentenceEncoder,
    bodies: Sequence[str | None],
    *,
    max_sentences: int,
    max_batch_tokens: int,
    max_batch_size: int,
    cap: LengthCap | None = None,
    ranking: RankerSettings | None = None,
) -> tuple[list[ExtractiveSummary], Embeddings]:
    """Summarises documents by their best-ranked sentences, kept in their original order.

    Bodies are normalised (HTML to text, NFC, whitespace) and split into bounded sentences;
    the sentences of documents the encoder can read are embedded together, so the length
    buckets span documents; each summary fits ``cap``.

    Args:
        encoder: a loaded encoder.
        bodies: the documents' texts.
        max_sentences: the most sentences a summary has (the cap's, when both are given).
        max_batch_tokens: padded tokens per model call.
        max_batch_size: texts per model call.
        cap: the hard length cap; default ``LengthCap(max_sentences=max_sentences)``.
        ranking: how sentences are ranked; default :class:`RankerSettings`.

    Returns:
        one summary per body ("" when a body has no text), each with the offsets of its
        sentences in the normalised body, and the sentence embeddings.
    """
    cap = cap or LengthCap(max_sentences=max_sentences)
    cap = replace(cap, max_sentences=min(cap.max_sentences, max_sentences))
    flats = [normalise_text(body) for body in bodies]
    spans = [sentence_spans(flat) for flat in flats]
    split = [[flat[a:b] for a, b in doc] for flat, doc in zip(flats, spans, strict=True)]
    readable = [encoder_can_read(" ".join(doc)) for doc in split]
    texts = [s for doc, ok in zip(split, readable, strict=True) if ok for s in doc]
    embedded = encode(encoder, texts, max_batch_tokens, max_batch_size)
    summaries, start = [], 0
    for sentences, places, ok in zip(split, spans, readable, strict=True):
        rows = embedded.vectors[start : start + len(sentences)] if ok else None
        start += len(sentences) if ok else 0
        ranked = ranking or RankerSettings()
        summaries.append(summarise_sentences(sentences, rows, cap, ranked, places))
    return summaries, embedded


def summarise_sentences(
    sentences: list[str],
    vectors: torch.Tensor | None,
    cap: LengthCap,
    ranking: RankerSettings,
    spans: Sequence[tuple[int, int]] | None = None,
) -> ExtractiveSummary:
    """One document's summary from its sentences (and their embeddings, when it has them).

    The cap's count of sentences (or all of a shorter text) are kept by rank while they fit
    the cap, in document order; when even the best one does not fit, its longest prefix that
    does is the summary.

    Args:
        sentences: the document's sentences, in order.
        vectors: one embedding per sentence, or None to rank by position.
        cap: the hard length cap.
        ranking: how sentences are ranked.
        spans: each sentence's offsets in the normalised document; the summary records the
            kept ones (none when not given).
    """
    if not sentences:
        return ExtractiveSummary("", ())
    places = list(spans) if spans is not None else []
    order = rank_sentences(vectors, sentences, ranking)
    count = summary_length(len(sentences), max_sentences=cap.max_sentences)
    kept = fit_to_cap(sentences, order, replace(cap, max_sentences=count))
    if not kept:
        best = order[0]
        prefix = truncate(sentences[best], cap)
        start = places[best][0] if places else 0
        return ExtractiveSummary(prefix, [(start, start + len(prefix))] if places else [])
    text = join_sentences([sentences[i] for i in kept])
    return ExtractiveSummary(text, [places[i] for i in kept] if places else [])
