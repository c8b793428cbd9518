"""Exact top-K unseen items for every user, one block of users at a time.

Scoring is exact: ``user @ items.T + bias`` for a block of users, seen items set to ``-inf``
inside the block, then ``topk`` (or, on a CPU with a large catalogue, the cache-tiled ranking of
``inference.recs.topk``). A block that runs out of device memory is scored again as two halves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from inference.engine.adaptive import BatchSizes
from inference.engine.device import to_device
from inference.recs.sparse import SparseRows
from inference.recs.topk import DEFAULT_BLOCK_ELEMENTS, ItemTiles, grouped_fits

if TYPE_CHECKING:
    import torch


def masked_top_k(
    scores: torch.Tensor, seen_rows: torch.Tensor, seen_cols: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` items per row of ``scores`` after setting seen (row, col) entries to -inf.

    ``scores`` is modified in place. Rows with fewer than ``k`` eligible items are padded
    with item -1 and score -inf, so the result is always (rows, k).
    """
    import torch

    scores[seen_rows, seen_cols] = float("-inf")
    values, items = torch.topk(scores, min(k, scores.shape[1]), dim=1)
    if values.shape[1] < k:
        pad = k - values.shape[1]
        values = torch.nn.functional.pad(values, (0, pad), value=float("-inf"))
        items = torch.nn.functional.pad(items, (0, pad), value=-1)
    return values, items.masked_fill(torch.isneginf(values), -1)


@dataclass(frozen=True)
class TopKBlock:
    """Recommendations for users ``start .. start + len(items)`` of one scoring call."""

    start: int
    scores: np.ndarray  # float32 (users, k), descending, -inf where padded
    items: np.ndarray  # int64 (users, k) dense item indices, -1 where padded
    seconds: float


def block_size_for(n_items: int, max_users: int, budget: int = DEFAULT_BLOCK_ELEMENTS) -> int:
    """Users per scoring block, so that a block's score matrix stays within ``budget``."""
    return max(1, min(max_users, budget // max(1, n_items)))


def iter_top_k(
    user_factors: torch.Tensor,
    item_factors: torch.Tensor,
    item_bias: torch.Tensor | None,
    seen: SparseRows,
    k: int,
    block_size: int,
    sizings: BatchSizes | None = None,
    tiled: bool = True,
) -> Iterator[TopKBlock]:
    """Exact top-``k`` unseen items for every user, one block of users at a time.

    On a CPU with fp32 factors and a large catalogue the scores are ranked by
    :meth:`inference.recs.topk.ItemTiles.top_k`, which keeps the score matrix in cache-sized
    tiles; elsewhere (GPU, bf16, small catalogues) by a full-block ``topk``. Both are exact.

    Args:
        user_factors: (users, dims) on the compute device; row ``r`` matches ``seen`` row r.
        item_factors: (items, dims) on the same device.
        item_bias: (items,) added to every user's scores, or None.
        seen: items each user already interacted with; they are never recommended.
        k: recommendations per user.
        block_size: users per block (see ``block_size_for``); a block that runs out of
            memory is scored again as two halves, and the size that fitted is kept.
        sizings: where that size is kept between calls (per starting block size), e.g. the
            model's :meth:`Recommender.block_sizings`; each call starts afresh without it.
        tiled: allow the cache-tiled CPU path; it copies the item factors into tiles on each
            call, which only pays for narrow factors (not EASE's items x items matrix).
    """
    import torch

    if seen.n_rows != user_factors.shape[0]:
        raise ValueError(f"seen has {seen.n_rows} rows for {user_factors.shape[0]} users")
    device = user_factors.device
    grouped = tiled and grouped_fits(item_factors, k) and user_factors.dtype == item_factors.dtype
    tiles = ItemTiles.build(item_factors, item_bias) if grouped else None
    items_t = None if tiles else item_factors.T.contiguous()
    if tiles is not None:
        # The tiles bound their own memory; whole chunks keep every GEMM full-sized, since a
        # block that is not a multiple of the chunk ends in a short chunk whose GEMM and
        # selection cost nearly as much as a full one.
        chunk = tiles.chunk_users()
        block_size = max(chunk, block_size - block_size % chunk)
    sizing = (BatchSizes() if sizings is None else sizings).at(block_size)

    def block(start: int, stop: int) -> TopKBlock:
        began = time.perf_counter()
        rows, cols, _ = seen.take(np.arange(start, stop))
        if tiles is not None:
            values, items = tiles.top_k(user_factors[start:stop], rows, cols, k)
        else:
            # Ranked in fp32 even when the factors are bf16, so near-ties keep their order.
            scores = (user_factors[start:stop] @ items_t).float()
            if item_bias is not None:
                scores += item_bias
            rows_t = to_device(torch.from_numpy(rows), device)
            values, items = masked_top_k(
                scores, rows_t, to_device(torch.from_numpy(cols), device), k
            )
        return TopKBlock(
            start, values.cpu().numpy(), items.cpu().numpy(), time.perf_counter() - began
        )

    with torch.inference_mode():
        for _, _, scored in sizing.run(user_factors.shape[0], block):
            yield scored


def top_k(
    user_factors: torch.Tensor,
    item_factors: torch.Tensor,
    item_bias: torch.Tensor | None,
    seen: SparseRows,
    k: int,
    block_size: int = 4096,
    tiled: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """All blocks of ``iter_top_k`` joined: (scores, items), each (users, k)."""
    blocks = list(
        iter_top_k(user_factors, item_factors, item_bias, seen, k, block_size, tiled=tiled)
    )
    if not blocks:
        return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
    return np.concatenate([b.scores for b in blocks]), np.concatenate([b.items for b in blocks])
