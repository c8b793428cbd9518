"""Which sentences of a document summarise it: a trained scorer, directed centrality, the lead.

The default is the trained scorer (:mod:`inference.text.ranker`), whose best-scored sentences
are kept unless they repeat a better one (a shared word trigram, as in BertSum's trigram
blocking: news repeats its lead almost word for word further down). The unsupervised ranker
below stays as ``pacsum``, for text unlike news, where a model trained on news may misjudge.

PacSum (Zheng & Lapata 2019, "Sentence Centrality Revisited for Unsupervised Summarization")
scores a sentence by its similarity to the rest of the document with a direction: similarity
to sentences *after* it counts ``lambda2`` per unit, similarity to sentences *before* it
``lambda1`` (negative in news, so a sentence that only repeats what came earlier loses), on
edges whose weight is first reduced by ``beta`` of the document's similarity range. It needs
no training; here the similarities are cosines of the packaged MiniLM sentence embeddings.

A lead prior mixes in each sentence's position, the strongest single signal in news; with the
defaults the lead sentences win unless centrality clearly disagrees (a weight of 8 puts the
first, second and third sentences 6, 2 and 0.7 standard deviations of centrality ahead of the
fourth). The defaults (lambda1 -0.5, lambda2 1, beta 0.3, lead weight 8) are the best of a
60-setting grid, ranked by the worst ROUGE-1 margin over Lead-3 on any source and form, on
every-k-th tuning samples of CNN and of Daily Mail articles, and are reported on disjoint
samples (``evaluation/summaries.py``; figures in ``benchmarks/eval-summaries.md``). A weak
prior suits CNN best but loses to Lead-3 on Daily Mail, whose leads carry the summary more often.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from inference.text.ranker import (
    PACSUM,
    is_furniture,
    load_ranker,
    pacsum_centrality,
    sentence_features,
    standardised,
)

if TYPE_CHECKING:
    import torch

# ASCII letters below this share of a document's letters: the English encoder cannot judge
# its sentences, and the summary is its lead.
MIN_LATIN_SHARE = 0.5


METHODS = ("trained", "pacsum", "lead")


@dataclass(frozen=True)
class RankerSettings:
    """How sentences are ranked.

    Attributes:
        method: ``"trained"`` (the packaged sentence scorer), ``"pacsum"`` (position-aware
            centrality plus a lead prior) or ``"lead"``.
        lambda1: weight of similarity to earlier sentences (PacSum's lambda1).
        lambda2: weight of similarity to later sentences (PacSum's lambda2).
        beta: share of the document's similarity range removed from every edge (PacSum's beta).
        lead_weight: weight of the lead prior against the (standardised) centrality.
        duplicate: similarity from which a sentence repeats one already kept.
        weights: the trained scorer's weights file; None for the packaged one.
    """

    method: str = "trained"
    lambda1: float = PACSUM["lambda1"]
    lambda2: float = PACSUM["lambda2"]
    beta: float = PACSUM["beta"]
    lead_weight: float = 8.0
    duplicate: float = 0.95
    weights: str | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"unknown ranking method {self.method!r}: use one of {', '.join(METHODS)}"
            )


def lead_prior(n: int) -> torch.Tensor:
    """1 for the first sentence, falling as 1 / (1 + position)."""
    import torch

    return 1.0 / (1.0 + torch.arange(n, dtype=torch.float32))


def rank_sentences(
    vectors: torch.Tensor | None, sentences: list[str], settings: RankerSettings
) -> list[int]:
    """Sentence indices, best first.

    Args:
        vectors: one unit-norm row per sentence, or None to rank by position only.
        sentences: the document's sentences, in order.
        settings: the ranking method and its hyperparameters.
    """
    import torch

    n = len(sentences)
    if settings.method == "lead" or vectors is None or n < 3:
        return list(range(n))
    if settings.method == "trained":
        scorer = load_ranker(Path(settings.weights)) if settings.weights else load_ranker()
        score = scorer.score(sentence_features(sentences, vectors))
        order = torch.argsort(score, descending=True, stable=True).tolist()
        # Furniture goes last, after what says something; a text of furniture keeps its order.
        order = sorted(order, key=lambda i: is_furniture(sentences[i]))
        return _skip_shared_trigrams(order, sentences)
    centrality = pacsum_centrality(vectors, settings.lambda1, settings.lambda2, settings.beta)
    score = standardised(centrality) + settings.lead_weight * lead_prior(n)
    order = torch.argsort(score, descending=True, stable=True).tolist()
    return _skip_repeats(order, vectors, settings.duplicate)


def _skip_shared_trigrams(order: list[int], sentences: list[str]) -> list[int]:
    """Moves sentences that share a word trigram with a better-ranked one to the end."""
    seen: set[tuple[str, ...]] = set()
    kept: list[int] = []
    repeats: list[int] = []
    for index in order:
        words = sentences[index].lower().split()
        trigrams = set(zip(words, words[1:], words[2:], strict=False))
        if trigrams & seen:
            repeats.append(index)
        else:
            kept.append(index)
            seen |= trigrams
    return kept + repeats


def _skip_repeats(order: list[int], vectors: torch.Tensor, duplicate: float) -> list[int]:
    """Moves sentences nearly identical to a better-ranked one to the end of the order."""
    kept: list[int] = []
    repeats: list[int] = []
    for index in order:
        if kept and float((vectors[kept] @ vectors[index]).max()) >= duplicate:
            repeats.append(index)
        else:
            kept.append(index)
    return kept + repeats


def encoder_can_read(text: str) -> bool:
    """Whether the (English) sentence encoder can judge ``text``: mostly Latin letters."""
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return False
    return sum(c.isascii() for c in letters) >= MIN_LATIN_SHARE * len(letters)
