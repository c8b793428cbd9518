"""A document's words as a fixed-size vector: signed feature hashing of sublinear term counts.

A sentence vector blurs the names and numbers a query shares with its document; a bag of words
keeps them. Hashing each word to one of ``dimension`` buckets with a sign from the same hash
(Weinberger et al., 2009) gives a vector of fixed length whose dot products estimate those of
the exact bag of words, with no vocabulary to fit or store: a vector depends only on its own
text, so vectors of different days stay comparable.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# Letters and digits, with inner apostrophes ("don't", "o'neill"); everything is lower-cased first.
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")

# Words that say nothing about what a text is about: English function words, and the verbs and
# numbers news repeats in every story ("said", "one"). A query and a document share them
# whatever their subjects, so counting them would only add noise to every dot product.
STOP_WORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been
    before being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in into
    is it its itself just me more most my myself no nor not now of off on once only or other our
    ours ourselves out over own s same she should so some such t than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    said says say one two new like get got may might must shall us""".split()
)


@dataclass(frozen=True)
class HashedTerms:
    """Words hashed into ``dimension`` signed buckets, each word's weight ``1 + log(count)``.

    The sublinear weight keeps a name repeated through an article from outweighing every other
    word; the sign makes colliding words cancel on average instead of adding up.
    """

    dimension: int = 1024

    def __post_init__(self) -> None:
        if self.dimension < 1:
            raise ValueError(f"a hashed bag of words needs at least 1 bucket, got {self.dimension}")

    def describe(self) -> str:
        """A short name for the method, part of the vectors' model version."""
        return f"hashed-terms{self.dimension}"

    def vectors(self, texts: Sequence[str]) -> np.ndarray:
        """One L2-normalised row per text (float32); a text without a content word is all zeros."""
        rows, slots, weights = [], [], []
        for row, text in enumerate(texts):
            counts = Counter(words(text))
            rows.append(np.full(len(counts), row, dtype=np.int64))
            slots.append(np.fromiter((_slot(w, self.dimension) for w in counts), np.int64))
            weights.append(1.0 + np.log(np.fromiter(counts.values(), np.float64)))
        out = np.zeros((len(texts), self.dimension), dtype=np.float64)
        if texts:
            signed = np.concatenate(slots)
            flat = np.concatenate(rows) * self.dimension + np.abs(signed) - 1
            np.add.at(out.reshape(-1), flat, np.sign(signed) * np.concatenate(weights))
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        # All of a text's words may cancel in a small table; such a row stays zero.
        np.divide(out, norms, out=out, where=norms > 0.0)
        return out.astype(np.float32)


def words(text: str) -> list[str]:
    """The content words of a text, lower-cased, stop words left out, in order."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]


@lru_cache(maxsize=1 << 18)
def _slot(word: str, dimension: int) -> int:
    # A process-independent hash (Python's hash() is salted per process): the
    # low bits choose the bucket, the top bit the sign; returned 1-based and signed.
    value = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
    bucket = (value & 0x7FFF_FFFF_FFFF_FFFF) % dimension
    return bucket + 1 if value >> 63 else -(bucket + 1)
