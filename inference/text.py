"""Extractive summaries: each document's best-ranked sentences, in document order, under a cap.

The sentence encoder (:mod:`inference.encoder`), embeddings (:mod:`inference.embeddings`) and
topics (:mod:`inference.topics`) live in their own modules; the names other code imports from
here are re-exported below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from inference.embeddings import Embeddings, encode
from inference.encoder import SentenceEncoder, encoder_version, load_sentence_encoder
from inference.rank import RankerSettings, encoder_can_read, rank_sentences
from inference.segment import LengthCap, fit_to_cap, join_sentences, split_sentences, truncate
from inference.topics import Topic, build_digest

__all__ = [
    "Embeddings",
    "SentenceEncoder",
    "Topic",
    "build_digest",
    "encode",
    "encoder_version",
    "extractive_summaries",
    "load_sentence_encoder",
    "summarise_sentences",
    "summary_length",
]


def summary_length(sentences: int, ratio: float = 0.2, max_sentences: int = 3) -> int:
    """How many sentences to keep: about ``ratio`` of the text, at least one, at most ``max``."""
    return max(1, min(max_sentences, round(sentences * ratio)))


def extractive_summaries(
    encoder: SentenceEncoder,
    bodies: Sequence[str | None],
    *,
    max_sentences: int,
    max_batch_tokens: int,
    max_batch_size: int,
    cap: LengthCap | None = None,
    ranking: RankerSettings | None = None,
) -> tuple[list[str], Embeddings]:
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
        one summary per body ("" when a body has no text) and the sentence embeddings.
    """
    cap = cap or LengthCap(max_sentences=max_sentences)
    cap = replace(cap, max_sentences=min(cap.max_sentences, max_sentences))
    split = [split_sentences(body) for body in bodies]
    readable = [encoder_can_read(" ".join(doc)) for doc in split]
    texts = [s for doc, ok in zip(split, readable, strict=True) if ok for s in doc]
    embedded = encode(encoder, texts, max_batch_tokens, max_batch_size)
    summaries, start = [], 0
    for sentences, ok in zip(split, readable, strict=True):
        rows = embedded.vectors[start : start + len(sentences)] if ok else None
        start += len(sentences) if ok else 0
        summaries.append(summarise_sentences(sentences, rows, cap, ranking or RankerSettings()))
    return summaries, embedded


def summarise_sentences(
    sentences: list[str],
    vectors: torch.Tensor | None,
    cap: LengthCap,
    ranking: RankerSettings,
) -> str:
    """One document's summary from its sentences (and their embeddings, when it has them).

    About a fifth of the sentences (at least one, at most the cap's) are kept by rank while
    they fit the cap, in document order; when even the best one does not fit, its longest
    prefix that does is the summary.
    """
    if not sentences:
        return ""
    order = rank_sentences(vectors, len(sentences), ranking)
    count = summary_length(len(sentences), max_sentences=cap.max_sentences)
    kept = fit_to_cap(sentences, order, replace(cap, max_sentences=count))
    if not kept:
        return truncate(sentences[order[0]], cap)
    return join_sentences([sentences[i] for i in kept])
