"""Long documents as encoder-sized chunks: token windows cut at sentence ends, and their weights.

A sentence encoder reads a bounded window (all-MiniLM-L6-v2: 256 tokens), so a document longer
than that is cut into chunks that each fit, embedded apart and pooled into one vector. A chunk
ends at the last sentence end inside its window when there is one in the window's second half,
so no chunk starts or stops mid-sentence unless a sentence is longer than half a window.
:class:`Chunking` is the whole recipe of a document's vector: the pooled chunks and, beside
them, the document's words hashed into a fixed number of buckets (:mod:`inference.text.lexical`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from inference.text.lexical import HashedTerms

# A sentence's last characters: its final mark, closing quotes or brackets, then a space or the end.
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*(?=\s|$)")


@dataclass(frozen=True)
class Chunking:
    """How a document becomes one vector: the first ``max_chunks`` chunks of ``window`` tokens
    (special tokens included), pooled with weight ``decay ** i`` for chunk ``i``; then, unless
    ``terms`` is None, that unit vector scaled by ``sqrt(1 - terms_weight)`` beside the
    document's hashed words scaled by ``sqrt(terms_weight)``, the whole normalised again.

    News, like most reports, states what it is about first: a decaying weight lets the lead
    dominate while later chunks still add the names and facts the first window never reaches.
    A query shares names and numbers with its document that a sentence vector blurs; with both
    parts unit-norm, the dot product of two vectors is ``(1 - terms_weight)`` times their
    sentence cosine plus ``terms_weight`` times their bag-of-words cosine.
    """

    window: int = 256
    max_chunks: int = 2
    decay: float = 0.3
    terms: HashedTerms | None = field(default_factory=HashedTerms)
    terms_weight: float = 0.5

    def __post_init__(self) -> None:
        if self.window < 8:
            raise ValueError(f"a chunk window of {self.window} tokens holds no text")
        if self.max_chunks < 1:
            raise ValueError(f"max_chunks must be at least 1, got {self.max_chunks}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")
        if not 0.0 < self.terms_weight < 1.0:
            raise ValueError(f"terms_weight must be in (0, 1), got {self.terms_weight}")

    def describe(self) -> str:
        """A short name for the method, part of the vectors' model version."""
        chunks = f"chunks{self.window}x{self.max_chunks}-decay{self.decay:g}"
        if self.terms is None:
            return chunks
        return f"{chunks}+{self.terms.describe()}-w{self.terms_weight:g}"

    def dimension(self, encoder_width: int) -> int:
        """The width of a document's vector from an encoder of ``encoder_width``."""
        return encoder_width + (self.terms.dimension if self.terms is not None else 0)

    def weights(self, chunks: int) -> list[float]:
        """The pooling weights of a document's first ``chunks`` chunks."""
        return [self.decay**i for i in range(chunks)]


def sentence_ends(text: str, offsets: Sequence[tuple[int, int]]) -> list[bool]:
    """For each token (by its character offsets in ``text``), whether a sentence ends after it:
    the text up to its end ends in ``.``, ``!`` or ``?`` (closing quotes or brackets may follow)
    and white space or the end of the text comes next."""
    stops = {m.end() for m in _SENTENCE_END.finditer(text)}
    return [stop in stops for _, stop in offsets]


def chunk_tokens(
    ids: Sequence[int], ends: Sequence[bool], size: int, max_chunks: int
) -> list[list[int]]:
    """Cuts a document's tokens into at most ``max_chunks`` chunks of at most ``size`` tokens.

    Args:
        ids: the document's token ids, without special tokens.
        ends: per token, whether a sentence ends after it (:func:`sentence_ends`).
        size: tokens per chunk, special tokens excluded.
        max_chunks: chunks kept; the rest of the document is not read.

    Returns:
        the chunks in document order; one empty chunk for an empty document.
    """
    chunks: list[list[int]] = []
    start = 0
    while start < len(ids) and len(chunks) < max_chunks:
        stop = min(start + size, len(ids))
        if stop < len(ids):
            # The last sentence end in the window's second half; else cut at the window.
            for j in range(stop - 1, start + size // 2 - 1, -1):
                if ends[j]:
                    stop = j + 1
                    break
        chunks.append(list(ids[start:stop]))
        start = stop
    return chunks or [[]]
