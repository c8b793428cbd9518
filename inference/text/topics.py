"""Topics of the day: documents clustered by their summaries, each labelled and summarised.

A document is the normalised mean of its summary sentences' embeddings; clusters come from
spherical k-means with the k of best silhouette; labels from class TF-IDF keywords.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from inference.text.embeddings import Embeddings, encode
from inference.text.encoder import SentenceEncoder
from inference.text.segment import is_unspaced, split_sentences

if TYPE_CHECKING:
    import torch

# Words of any alphabet (letters at both ends, three or more characters); digits are not words.
_WORD = re.compile(r"[^\W\d_][\w'-]+[^\W\d_]")
# A fallback label's length: a few words, or characters for text written without spaces.
_LABEL_WORDS = 4
_LABEL_CHARS = 16
STOPWORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    out over own said same says she should so some such than that the their theirs them then there
    these they this those through to too under until up very was we were what when where which
    while who whom why will with would you your yours new one two three last next week day days
    year years today yesterday monday tuesday wednesday thursday friday saturday sunday many much
    may might must per since still well according expected later early around told""".split()
)


@dataclass(frozen=True)
class Topic:
    """One cluster of the day's documents."""

    topic_id: int
    label: str
    doc_ids: list[str]
    summary: str


def select_central(
    vectors: torch.Tensor,
    count: int,
    centre: torch.Tensor | None = None,
    redundancy: float = 0.5,
    duplicate: float = 0.95,
) -> list[int]:
    """Picks the most central rows with maximal marginal relevance.

    Each pick maximises ``(1 - redundancy) * sim(centre) - redundancy * max sim(picked)``, so a
    sentence close to one already chosen loses to a slightly less central new one; rows at
    least ``duplicate`` similar to a pick are never picked (fewer than ``count`` may remain).

    Args:
        vectors: unit-norm rows (sentences).
        count: how many to pick.
        centre: the direction to be central to; default the rows' normalised mean.
        redundancy: weight of the penalty for resembling what was already picked.
        duplicate: similarity from which a row counts as a repeat of a pick.

    Returns:
        picked row indices, most relevant first.
    """
    import torch
    import torch.nn.functional as F

    if len(vectors) == 0:
        return []
    centre = F.normalize(vectors.mean(dim=0) if centre is None else centre, dim=-1)
    relevance = vectors @ centre
    similarity = vectors @ vectors.T
    picked: list[int] = []
    closest = torch.zeros(len(vectors))
    while len(picked) < count and bool((closest < duplicate).any()):
        score = (1 - redundancy) * relevance - redundancy * closest
        best = int(torch.argmax(score.masked_fill(closest >= duplicate, -torch.inf)))
        picked.append(best)
        closest = torch.maximum(closest, similarity[best])
    return picked


def kmeans(
    vectors: torch.Tensor, k: int, *, iterations: int = 50, restarts: int = 16, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spherical k-means (cosine) with k-means++ seeding; the best of ``restarts`` runs.

    Returns:
        (labels, unit-norm centroids).
    """
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(seed)
    best: tuple[float, torch.Tensor, torch.Tensor] | None = None
    for _ in range(restarts):
        centroids = _kmeans_pp(vectors, k, generator)
        for _ in range(iterations):
            labels = torch.argmax(vectors @ centroids.T, dim=1)
            sums = torch.zeros_like(centroids).index_add_(0, labels, vectors)
            empty = torch.bincount(labels, minlength=k) == 0
            # An emptied cluster keeps its old centroid instead of collapsing to zero.
            updated = torch.where(empty[:, None], centroids, F.normalize(sums, dim=1))
            if torch.equal(updated, centroids):
                break
            centroids = updated
        labels = torch.argmax(vectors @ centroids.T, dim=1)
        fit = float((vectors * centroids[labels]).sum())
        if best is None or fit > best[0]:
            best = (fit, labels, centroids)
    return best[1], best[2]


def _kmeans_pp(vectors: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    import torch

    chosen = [int(torch.randint(len(vectors), (1,), generator=generator))]
    distance = (1 - vectors @ vectors[chosen[0]]).clamp(min=0)
    for _ in range(1, k):
        weights = distance if float(distance.sum()) > 0 else torch.ones(len(vectors))
        chosen.append(int(torch.multinomial(weights, 1, generator=generator)))
        distance = torch.minimum(distance, (1 - vectors @ vectors[chosen[-1]]).clamp(min=0))
    return vectors[chosen].clone()


def silhouette(vectors: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean silhouette under cosine distance (1 for tight, well separated clusters)."""
    import torch
    import torch.nn.functional as F

    distance = (1 - vectors @ vectors.T).clamp(min=0)
    k = int(labels.max()) + 1
    onehot = F.one_hot(labels, k).float()
    counts = onehot.sum(dim=0)
    per_cluster = distance @ onehot
    own = counts[labels]
    a = per_cluster.gather(1, labels[:, None]).squeeze(1) / (own - 1).clamp(min=1)
    mean_to = per_cluster / counts.clamp(min=1)
    mean_to[torch.arange(len(labels)), labels] = torch.inf
    mean_to[:, counts == 0] = torch.inf
    b = mean_to.min(dim=1).values
    score = (b - a) / torch.maximum(a, b).clamp(min=1e-12)
    score = torch.where(own > 1, score, torch.zeros_like(a))
    return float(score.mean())


def choose_clusters(
    vectors: torch.Tensor, k_min: int = 2, k_max: int = 12, seed: int = 0, sample: int = 2000
) -> torch.Tensor:
    """Clusters rows with the k in ``[k_min, k_max]`` of best silhouette; one cluster if few rows.

    The silhouette is quadratic in rows, so on a large day it is scored on a fixed random
    ``sample`` of them.
    """
    import torch

    n = len(vectors)
    if n < 3:
        return torch.zeros(n, dtype=torch.long)
    scored = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:sample]
    best: tuple[float, torch.Tensor] | None = None
    for k in range(k_min, min(k_max, n - 1) + 1):
        labels, _ = kmeans(vectors, k, seed=seed)
        score = silhouette(vectors[scored], labels[scored])
        if best is None or score > best[0]:
            best = (score, labels)
    return best[1]


def distinctive_keywords(
    texts_by_cluster: Sequence[Sequence[str]], top: int = 3
) -> list[list[str]]:
    """Each cluster's words that many of its texts use and few other texts do.

    Words are counted once per text (document frequency), so one long or repetitive text
    cannot carry a label; the weight is class TF-IDF over clusters.
    """
    counts = [
        Counter(w for t in texts for w in set(_WORD.findall(t.lower())) - STOPWORDS)
        for texts in texts_by_cluster
    ]
    overall = sum(counts, Counter())
    texts = sum(len(c) for c in texts_by_cluster)
    keywords = []
    for cluster, members in zip(counts, texts_by_cluster, strict=True):
        size = max(1, len(members))
        scored = {w: (c / size) * np.log(1 + texts / overall[w]) for w, c in cluster.items()}
        keywords.append(sorted(scored, key=lambda w: (-scored[w], w))[:top])
    return keywords


def topic_label(keywords: Sequence[str], central_sentence: str, topic_id: int) -> str:
    """A topic's label, never empty: its keywords; else (no word in any alphabet the keyword
    counter knows, such as Chinese without spaces or emoji) the opening of its most central
    sentence; else ``topic N``."""
    label = ", ".join(w[:_LABEL_CHARS] for w in keywords if w.strip())
    if label:
        return label
    opening = " ".join(central_sentence.split()[:_LABEL_WORDS])
    if is_unspaced(opening):
        opening = opening[:_LABEL_CHARS]
    return opening.strip() or f"topic {topic_id + 1}"


def build_digest(
    encoder: SentenceEncoder,
    doc_ids: Sequence[str],
    summaries: Sequence[str],
    *,
    max_batch_tokens: int,
    max_batch_size: int,
    k_max: int = 12,
    summary_sentences: int = 3,
    keywords: int = 3,
) -> tuple[list[Topic], Embeddings]:
    """Groups the day's documents into topics from their summaries.

    A document is represented by the normalised mean of its summary sentences' embeddings; each
    topic is labelled by distinctive keywords and summarised by the summary sentences most
    central to it. Topics are numbered largest first.
    """
    import torch
    import torch.nn.functional as F

    split = [split_sentences(s) or [s] for s in summaries]
    owner = torch.tensor([d for d, doc in enumerate(split) for _ in doc], dtype=torch.long)
    sentences = [s for doc in split for s in doc]
    embedded = encode(encoder, sentences, max_batch_tokens, max_batch_size)
    if not doc_ids:
        return [], embedded
    sums = torch.zeros(len(split), embedded.vectors.shape[1]).index_add_(0, owner, embedded.vectors)
    docs = F.normalize(sums, dim=1)
    labels = choose_clusters(docs, k_max=k_max)
    members = [torch.nonzero(labels == c).flatten() for c in range(int(labels.max()) + 1)]
    members = sorted((m for m in members if len(m)), key=lambda m: (-len(m), int(m[0])))
    texts = [[summaries[i] for i in m.tolist()] for m in members]
    words = distinctive_keywords(texts, top=keywords)
    topics = []
    for topic_id, (member, label_words) in enumerate(zip(members, words, strict=True)):
        rows = torch.nonzero(torch.isin(owner, member)).flatten()
        centre = docs[member].mean(dim=0)
        picked = select_central(embedded.vectors[rows], summary_sentences, centre=centre)
        central = sentences[int(rows[picked[0]])] if picked else ""
        topics.append(
            Topic(
                topic_id=topic_id,
                label=topic_label(label_words, central, topic_id),
                doc_ids=[doc_ids[i] for i in member.tolist()],
                summary=" ".join(sentences[int(rows[p])] for p in picked),
            )
        )
    return topics, embedded
