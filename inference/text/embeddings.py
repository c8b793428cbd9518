"""Sentence and document embeddings in length-bucketed batches under a padded-token budget.

Mean pooling over real tokens, then L2 normalisation, so a dot product is a cosine. A document
longer than the encoder's window is embedded in chunks (:mod:`inference.text.chunks`) that share the
batches of all documents in the call, and its chunk vectors are pooled into one, beside its
hashed words when the chunking says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from inference.engine.batching import length_buckets, padding_ratio
from inference.engine.device import to_device
from inference.text.chunks import Chunking, chunk_tokens, sentence_ends
from inference.text.encoder import SentenceEncoder

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Embeddings:
    """Unit-norm vectors (float32, on the CPU) and what computing them cost: ``tokens`` is the
    tokens the model encoded (its attention masks' sum: padding not counted, a text or chunk
    repeated in the call encoded and counted once)."""

    vectors: torch.Tensor
    model_calls: int
    padding: float
    tokens: int = 0


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
    import torch

    unique = list(dict.fromkeys(texts))
    width = encoder.model.config.hidden_size
    if not unique:
        return Embeddings(torch.empty(0, width), 0, 0.0)
    ids = encoder.tokenizer(unique, truncation=True, max_length=encoder.max_length)["input_ids"]
    embedded = encode_tokens(encoder, ids, max_batch_tokens, max_batch_size)
    position = {text: i for i, text in enumerate(unique)}
    rows = torch.tensor([position[t] for t in texts], dtype=torch.long)
    return Embeddings(
        embedded.vectors[rows], embedded.model_calls, embedded.padding, embedded.tokens
    )


def encode_tokens(
    encoder: SentenceEncoder,
    ids: Sequence[Sequence[int]],
    max_batch_tokens: int,
    max_batch_size: int,
) -> Embeddings:
    """Embeds token sequences (special tokens included, each within the encoder's window) in
    length-bucketed batches under a padded-token budget.

    Args:
        encoder: a loaded encoder.
        ids: the token ids of each text.
        max_batch_tokens: padded tokens per model call.
        max_batch_size: texts per model call.

    Returns:
        one unit-norm row per sequence, in the order given.
    """
    import torch

    width = encoder.model.config.hidden_size
    if not ids:
        return Embeddings(torch.empty(0, width), 0, 0.0)
    lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
    buckets = length_buckets(lengths, max_batch_tokens, max_batch_size)
    pad = encoder.tokenizer.pad_token_id or 0
    device = encoder.runtime.device
    budget = encoder.token_budget(max_batch_tokens)
    # Pooled vectors stay on the device until the end: one read-back for the whole call, so on
    # a GPU the host pads the next bucket while the current one runs.
    out = torch.empty(len(ids), width, device=device)

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
    # Each sequence's real tokens, once, even where out-of-memory back-off ran its bucket again.
    tokens = int(lengths.sum())
    return Embeddings(out.cpu(), calls, padding_ratio(lengths, buckets), tokens)


def embed_documents(
    encoder: SentenceEncoder,
    texts: Sequence[str],
    chunking: Chunking,
    max_batch_tokens: int,
    max_batch_size: int,
) -> Embeddings:
    """One unit vector per document from the chunks of its text (:class:`Chunking`).

    Each document's first chunks are embedded (all documents' chunks bucketed together), then
    pooled as the normalised weighted sum of their unit vectors, so a document's vector depends
    only on its own text and on the model calls its chunks share. Identical documents and
    identical chunks are embedded once. With ``chunking.terms`` the document's hashed words
    follow the pooled vector (:func:`with_terms`). A query is embedded the same way, so it
    matches a document on both parts.

    Args:
        encoder: a loaded encoder.
        texts: the documents' texts.
        chunking: chunk window, chunks per document and their weights.
        max_batch_tokens: padded tokens per model call.
        max_batch_size: chunks per model call.

    Returns:
        one unit-norm row per document of ``chunking.dimension(hidden size)``, in the order given.
    """
    import torch

    unique = list(dict.fromkeys(texts))
    width = chunking.dimension(encoder.model.config.hidden_size)
    if not unique:
        return Embeddings(torch.empty(0, width), 0, 0.0)
    chunks = document_chunks(encoder, unique, chunking)
    # Identical chunks (a shared lead, boilerplate) are embedded once, so they get the same bits.
    distinct = list(dict.fromkeys(tuple(chunk) for doc in chunks for chunk in doc))
    embedded = encode_tokens(encoder, distinct, max_batch_tokens, max_batch_size)
    row = {chunk: i for i, chunk in enumerate(distinct)}
    order = torch.tensor([row[tuple(chunk)] for doc in chunks for chunk in doc], dtype=torch.long)
    pooled = pool_chunks(embedded.vectors[order], [len(doc) for doc in chunks], chunking)
    if chunking.terms is not None:
        terms = torch.from_numpy(chunking.terms.vectors(unique))
        pooled = with_terms(pooled, terms, chunking.terms_weight)
    position = {text: i for i, text in enumerate(unique)}
    rows = torch.tensor([position[t] for t in texts], dtype=torch.long)
    return Embeddings(pooled[rows], embedded.model_calls, embedded.padding, embedded.tokens)


def pool_chunks(vectors: torch.Tensor, counts: Sequence[int], chunking: Chunking) -> torch.Tensor:
    """Pools consecutive chunk vectors into one unit vector per document.

    Args:
        vectors: unit chunk vectors, each document's in order, documents one after another.
        counts: each document's number of chunks; only its first ``chunking.max_chunks`` count.
        chunking: the chunks' weights.

    Returns:
        one row per document: the normalised weighted sum of its chunk vectors.
    """
    import torch
    import torch.nn.functional as F

    most = min(max(counts, default=1), chunking.max_chunks)
    stacked = torch.zeros(most, len(counts), vectors.shape[1])
    weights = torch.zeros(most, len(counts), 1)
    start = 0
    for row, count in enumerate(counts):
        kept = min(count, most)
        stacked[:kept, row] = vectors[start : start + kept]
        weights[:kept, row, 0] = torch.tensor(chunking.weights(kept))
        start += count
    # Chunk by chunk, adding zeros where a document has no more: the same additions in the same
    # order whatever the other documents of the call, so a vector never depends on them.
    summed = torch.zeros(len(counts), vectors.shape[1])
    for chunk, weight in zip(stacked, weights, strict=True):
        summed += chunk * weight
    return F.normalize(summed, dim=-1)


def with_terms(dense: torch.Tensor, terms: torch.Tensor, weight: float) -> torch.Tensor:
    """Each row's unit sentence vector beside its unit (or zero) bag of words, as one unit vector.

    Scaled by ``sqrt(1 - weight)`` and ``sqrt(weight)``, two such rows have the dot product
    ``(1 - weight) * dense cosine + weight * terms cosine``. A text without a content word has
    zero terms and is renormalised to its sentence vector alone.
    """
    import torch
    import torch.nn.functional as F

    joined = torch.cat([dense * (1.0 - weight) ** 0.5, terms * weight**0.5], dim=1)
    return F.normalize(joined, dim=-1)


def document_chunks(
    encoder: SentenceEncoder, texts: Sequence[str], chunking: Chunking
) -> list[list[list[int]]]:
    """Each text's chunks as token ids, special tokens included, cut at sentence ends."""
    if chunking.window > encoder.max_length:
        raise ValueError(
            f"chunks of {chunking.window} tokens exceed {encoder.version}'s window of "
            f"{encoder.max_length}"
        )
    tokenizer = encoder.tokenizer
    prefix, suffix = special_tokens(tokenizer)
    size = chunking.window - len(prefix) - len(suffix)
    # Only the chunks kept are read; the cap keeps a huge document's tokens bounded too.
    cap = size * chunking.max_chunks + size
    tokens = tokenizer(
        list(texts),
        add_special_tokens=False,
        truncation=True,
        max_length=cap,
        return_offsets_mapping=True,
    )
    out = []
    for text, ids, offsets in zip(
        texts, tokens["input_ids"], tokens["offset_mapping"], strict=True
    ):
        cut = chunk_tokens(ids, sentence_ends(text, offsets), size, chunking.max_chunks)
        out.append([prefix + chunk + suffix for chunk in cut])
    return out


def special_tokens(tokenizer) -> tuple[list[int], list[int]]:
    """The ids a tokenizer puts before and after one sequence (BERT: ``[CLS]``, ``[SEP]``), read
    off a probe, so a chunk cut from plain ids is framed as the tokenizer frames a text."""
    framed = tokenizer("probe")["input_ids"]
    plain = tokenizer("probe", add_special_tokens=False)["input_ids"]
    for start in range(len(framed) - len(plain) + 1):
        if framed[start : start + len(plain)] == plain:
            return framed[:start], framed[start + len(plain) :]
    raise ValueError(f"{type(tokenizer).__name__} does not frame a text around its own tokens")


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Averages token vectors over real (unmasked) tokens and L2-normalises the result."""
    import torch.nn.functional as F

    weights = mask.to(hidden.dtype).unsqueeze(-1)
    summed = (hidden * weights).sum(dim=1)
    return F.normalize(summed / weights.sum(dim=1).clamp(min=1.0), dim=-1)
