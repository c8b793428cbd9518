"""Exact top-K over a large catalogue on the CPU, in cache-sized tiles.

``inference.recs.topk_blocks.iter_top_k`` uses this for fp32 factors on the CPU when the catalogue
is large; GPUs and small catalogues rank whole rows with ``torch.topk``.

A chunk of users times one tile of items is scored by one GEMM, its seen items set to -inf,
and reduced to maxima over groups of items while the tile is still in cache; only groups that
can still reach a user's top k are kept, so the full score matrix never goes to memory. The
bias rides along as one more dimension (users get a constant 1), so one GEMM yields the final
scores. Items are tiled by descending norm of (factors, bias): a score is at most the user's
norm times the item's, so the first tiles hold more of each user's best items, the bar for
later groups rises sooner and fewer groups are kept. The engine and tile shape are in
``inference.recs.topk_kernels``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from inference.recs.topk_kernels import GROUP_ITEMS, MAX_TILE_ITEMS, Kernel, default_kernel

# Score-matrix elements per block (x4 bytes): large enough to keep the matmul efficient,
# small enough that a 1M-item catalogue still scores in blocks of a few hundred MB.
DEFAULT_BLOCK_ELEMENTS = 1 << 24

# Smaller catalogues rank whole rows: there the tiles' fixed costs (the copy into tiles, the
# per-tile selection) are not repaid by keeping the scores in cache.
GROUPED_MIN_ITEMS = 8 * MAX_TILE_ITEMS


def grouped_fits(item_factors: torch.Tensor, k: int) -> bool:
    n_items = item_factors.shape[0]
    return (
        item_factors.device.type == "cpu"
        and item_factors.dtype == torch.float32
        and n_items >= GROUPED_MIN_ITEMS
        and k * GROUP_ITEMS * 4 <= n_items
    )


@dataclass(frozen=True)
class ItemTiles:
    """Item factors cut into GEMM tiles, with the bias per tile (-inf on padding items).

    Exactness of :meth:`top_k` rests on one fact. Let ``M`` be the k-th highest group
    maximum of a row (seen items already -inf) and ``S`` its k-th highest score. The ``k``
    groups with the highest maxima hold ``k`` distinct scores of at least ``M``, so
    ``S >= M``: every score in the top ``k`` (ties included) is at least ``M``, and so is its
    group's maximum. Scanning the tiles, the k-th highest group maximum seen so far only
    grows towards ``M``, so a group whose maximum is below it at any point can be dropped;
    at the end, the kept items scoring at least ``M`` are all items scoring at least ``S``.
    None of this depends on the order of the items in the tiles. Ranking the kept items by
    (score descending, item id ascending) gives the brute-force order exactly.
    """

    # (kernel.tile_items, dims + 1) float32 each, the last column the bias; in oneDNN's
    # layout when oneDNN is the engine.
    tiles: list[torch.Tensor]
    n_items: int
    kernel: Kernel
    # The item id at each tile position (padding positions past n_items keep their own
    # index, and only ever carry -inf), and the position of each item id.
    ids: np.ndarray
    positions: np.ndarray

    @classmethod
    def build(
        cls,
        item_factors: torch.Tensor,
        item_bias: torch.Tensor | None,
        kernel: Kernel | None = None,
    ) -> ItemTiles:
        """Tiles for ``kernel`` (by default the fixed shape on this process's engine)."""
        n_items, dims = item_factors.shape
        kernel = kernel or default_kernel()
        size = kernel.tile_items
        padded = -(-n_items // size) * size
        augmented = np.zeros((n_items, dims + 1), dtype=np.float32)
        augmented[:, :dims] = item_factors.numpy()
        if item_bias is not None:
            augmented[:, dims] = item_bias.float().numpy()
        # Stable, so equal norms keep id order and the layout is the same in every process.
        order = np.argsort(-np.einsum("ij,ij->i", augmented, augmented), kind="stable")
        # Padding items score -inf: zero factors, -inf bias (times the users' constant 1).
        factors = np.zeros((padded, dims + 1), dtype=np.float32)
        factors[:n_items] = augmented[order]
        factors[n_items:, dims] = -np.inf
        tiles = [torch.from_numpy(factors[j : j + size].copy()) for j in range(0, padded, size)]
        ids = np.concatenate([order, np.arange(n_items, padded)]).astype(np.int64)
        positions = np.empty(n_items, dtype=np.int64)
        positions[order] = np.arange(n_items)
        return cls(kernel.packed(tiles), n_items, kernel, ids, positions)

    def chunk_users(self) -> int:
        """Users per chunk: a chunk's working set is one tile of scores, whatever the items."""
        return self.kernel.chunk_users

    def top_k(
        self, users: torch.Tensor, rows: np.ndarray, cols: np.ndarray, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-``k`` of ``users @ items.T + bias`` with (rows, cols) excluded.

        Args:
            users: (n, dims) user factors.
            rows, cols: seen entries, ``rows`` local to ``users`` and sorted.
            k: items per user.

        Returns:
            (scores, items), each (n, k), descending, ties by lowest item; -inf and -1 where
            fewer are eligible.
        """
        chunk = self.chunk_users()
        bounds = np.searchsorted(rows, np.arange(0, len(users) + chunk, chunk))
        cols = self.positions[cols]
        augmented = np.ones((len(users), users.shape[1] + 1), dtype=np.float32)
        augmented[:, :-1] = users.numpy()
        augmented_t = torch.from_numpy(augmented)
        values, items = [], []
        # oneDNN runs on torch's threads; numpy's BLAS is held to as many. The limit is set
        # once per call, not per chunk, because threadpoolctl reads /proc/self/maps each time.
        limit = contextlib.nullcontext()
        if self.kernel.engine == "blas":
            from threadpoolctl import threadpool_limits

            limit = threadpool_limits(limits=torch.get_num_threads(), user_api="blas")
        with limit:
            for c, start in enumerate(range(0, len(users), chunk)):
                seen = slice(bounds[c], bounds[c + 1])
                kept = self._scan(
                    augmented_t[start : start + chunk], rows[seen] - start, cols[seen], k
                )
                v, i = _first_k(*kept, min(chunk, len(users) - start), k)
                values.append(v)
                items.append(i)
        if not values:
            return torch.empty(0, k), torch.empty(0, k, dtype=torch.long)
        return torch.from_numpy(np.concatenate(values)), torch.from_numpy(np.concatenate(items))

    def _scan(
        self, users: torch.Tensor, rows: np.ndarray, cols: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(owner, score, item id) of every item of a chunk that can be in its users' top k;
        ``cols`` are tile positions."""
        n, size, width = len(users), self.kernel.tile_items, self.kernel.groups
        # Seen entries as flat positions in their tile's (n, size) scores, by tile.
        tile_of = cols // size
        order = np.argsort(tile_of, kind="stable")
        flat = (rows * size + cols % size)[order]
        cuts = np.searchsorted(tile_of[order], np.arange(len(self.tiles) + 1))
        # Columns [0, k) hold the k highest group maxima so far, [k, k + width) the tile's.
        maxima = np.full((n, k + width), -np.inf, dtype=np.float32)
        tile_maxima = maxima[:, k:]
        kept_rows, kept_base, kept_scores = [], [], []
        gemm = self.kernel.gemm
        for j, tile in enumerate(self.tiles):
            scores = gemm(users, tile)
            if cuts[j + 1] > cuts[j]:
                scores.reshape(-1)[flat[cuts[j] : cuts[j + 1]]] = -np.inf
            # Strided groups make each group maximum an element-wise maximum of contiguous
            # rows, which vectorises; torch.amax does it faster than numpy's reductions.
            grouped = scores.reshape(n, GROUP_ITEMS, width)
            torch.amax(torch.from_numpy(grouped), dim=1, out=torch.from_numpy(tile_maxima))
            # numpy's sort of these short rows is far cheaper than torch.topk per row.
            ranked = np.sort(maxima, axis=1)
            maxima[:, :k] = ranked[:, -k:]
            hit = np.flatnonzero(tile_maxima >= ranked[:, -k, None])
            r, g = np.divmod(hit, width)
            kept_rows.append(r)
            kept_base.append(j * size + g)
            kept_scores.append(grouped[r, :, g])
        # Items of the kept groups scoring at least the final k-th group maximum.
        rows_k, base, kept = map(np.concatenate, (kept_rows, kept_base, kept_scores))
        hit = np.flatnonzero(kept >= maxima[rows_k, :1])
        group, member = np.divmod(hit, GROUP_ITEMS)
        return rows_k[group], kept.reshape(-1)[hit], self.ids[base[group] + member * width]


def _first_k(
    owner: np.ndarray, value: np.ndarray, item: np.ndarray, n: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k`` of each of ``n`` users' ranked candidates; fewer only if the maxima
    were NaN or too few items are eligible (then -inf and -1)."""
    owner, value, item = _ranked(owner, value, item)
    starts = np.searchsorted(owner, np.arange(n + 1))
    position = starts[:-1, None] + np.arange(k)
    valid = position < starts[1:, None]
    position = np.minimum(position, max(len(owner) - 1, 0))
    top = np.where(valid, value[position] if len(owner) else -np.inf, -np.inf)
    ids = np.where(valid & ~np.isneginf(top), item[position] if len(owner) else -1, -1)
    return top.astype(np.float32), ids.astype(np.int64)


def _ranked(
    owner: np.ndarray, value: np.ndarray, item: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted by owner, then score descending, then item: one int64 key sort (radix-like
    and vectorised in numpy, unlike ``np.lexsort``), with ``lexsort`` only where scores tie."""
    bits = (value + np.float32(0)).view(np.int32)  # + 0 makes -0.0 into 0.0
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # int32 order == float order
    key = (owner.astype(np.int64) << 32) + (np.int64(0x7FFFFFFF) - ordered)
    order = np.argsort(key)
    if np.any(np.diff(key[order]) == 0):
        order = np.lexsort((item, -value, owner))
    return owner[order], value[order], item[order]
