"""Sentence embeddings in length-bucketed batches under a padded-token budget.

Mean pooling over real tokens, then L2 normalisation, so a dot product is a cosine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from inference.batching import length_buckets, padding_ratio
from inference.device import to_device
from inference.encoder import SentenceEncoder


@dataclass(frozen=True)
class Embeddings:
    """Unit-norm vectors (float32, on the CPU) and what computing them cost."""

    vectors: torch.Tensor
    model_calls: int
    padding: float


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
