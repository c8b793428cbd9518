"""Exact top-K over a large catalogue on the CPU, in cache-sized tiles.

``inference.recs.topk_blocks.iter_top_k`` uses this for fp32 factors on the CPU when the catalogue
is large; GPUs and small catalogues rank whole rows with ``torch.topk``.

A chunk of users times one tile of items is scored by one GEMM, its seen items set to -inf,
and reduced to maxima over groups of items while the tile is still in cache; only groups that
can still reach a user's top k are read again, into a heap per user
(``inference.recs.topk_select``), so the full score matrix never goes to memory. The
bias rides along as one more dimension (users get a constant 1), so one GEMM yields the final
scores. Items are tiled by descending norm of (factors, bias): a score is at most the user's
norm times the item's, so the first tiles hold more of each user's best items, the bar for
later groups rises sooner and fewer groups are read. The engine and tile shape are in
``inference.recs.topk_kernels``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from inference.recs.topk_kernels import GROUP_ITEMS, MAX_TILE_ITEMS, Kernel, default_kernel

if TYPE_CHECKING:
    import torch

# Score-matrix elements per block (x4 bytes): large enough to keep the matmul efficient,
# small enough that a 1M-item catalogue still scores in blocks of a few hundred MB.
DEFAULT_BLOCK_ELEMENTS = 1 << 24

# Smaller catalogues rank whole rows: there the tiles' fixed costs (the copy into tiles, the
# per-tile selection) are not repaid by keeping the scores in cache.
GROUPED_MIN_ITEMS = 8 * MAX_TILE_ITEMS


def grouped_fits(item_factors: torch.Tensor, k: int) -> bool:
    import torch

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

    Exactness of :meth:`top_k` rests on one fact. Each user's heap holds its ``k`` best
    (score, item) so far in the brute-force order (score descending, item id ascending), and
    an item enters only if it beats the heap's worst. A group whose maximum is below that
    worst score holds no item that beats it, now or later, since the worst only rises; so
    skipping such a group never drops an item of the final top ``k``. None of this depends on
    the order of the items in the tiles.
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
        import torch

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
        import torch

        from inference.recs import topk_select  # numba: imported where it is used

        chunk = self.chunk_users()
        bounds = np.searchsorted(rows, np.arange(0, len(users) + chunk, chunk))
        cols = self.positions[cols]
        augmented = np.ones((len(users), users.shape[1] + 1), dtype=np.float32)
        augmented[:, :-1] = users.numpy()
        augmented_t = torch.from_numpy(augmented)
        values = np.empty((len(users), k), dtype=np.float32)
        items = np.empty((len(users), k), dtype=np.int64)
        # oneDNN runs on torch's threads; numpy's BLAS is held to as many. The limit is set
        # once per call, not per chunk, because threadpoolctl reads /proc/self/maps each time.
        limit = contextlib.nullcontext()
        if self.kernel.engine == "blas":
            from threadpoolctl import threadpool_limits

            limit = threadpool_limits(limits=torch.get_num_threads(), user_api="blas")
        with limit:
            for c, start in enumerate(range(0, len(users), chunk)):
                seen = slice(bounds[c], bounds[c + 1])
                stop = min(start + chunk, len(users))
                heaps = topk_select.empty_heaps(stop - start, k)
                self._scan(augmented_t[start:stop], rows[seen] - start, cols[seen], heaps)
                topk_select.ranked(*heaps, values[start:stop], items[start:stop])
        return torch.from_numpy(values), torch.from_numpy(items)

    def _scan(
        self,
        users: torch.Tensor,
        rows: np.ndarray,
        cols: np.ndarray,
        heaps: tuple[np.ndarray, np.ndarray],
    ) -> None:
        """Offer a chunk's users every tile, into their (scores, items) ``heaps``; ``cols``
        are tile positions."""
        import torch

        from inference.recs.topk_select import select_tile

        n, size, width = len(users), self.kernel.tile_items, self.kernel.groups
        # Seen entries as flat positions in their tile's (n, size) scores, by tile.
        tile_of = cols // size
        order = np.argsort(tile_of, kind="stable")
        flat = (rows * size + cols % size)[order]
        cuts = np.searchsorted(tile_of[order], np.arange(len(self.tiles) + 1))
        maxima = np.empty((n, width), dtype=np.float32)
        maxima_t = torch.from_numpy(maxima)
        floors = np.full(n, -np.inf, dtype=np.float32)
        k = heaps[0].shape[1]
        gemm = self.kernel.gemm
        for j, tile in enumerate(self.tiles):
            scores = gemm(users, tile)
            if cuts[j + 1] > cuts[j]:
                scores.reshape(-1)[flat[cuts[j] : cuts[j + 1]]] = -np.inf
            # Strided groups make each group maximum an element-wise maximum of contiguous
            # rows, which vectorises; torch.amax does it faster than numpy's reductions.
            grouped = torch.from_numpy(scores.reshape(n, GROUP_ITEMS, width))
            torch.amax(grouped, dim=1, out=maxima_t)
            if j == 0 and k <= width:
                # The heaps are empty: without a floor every group of the first tile is read.
                floors = _kth_highest(maxima, k)
            select_tile(scores, maxima, self.ids[j * size : (j + 1) * size], floors, *heaps)


def _kth_highest(maxima: np.ndarray, k: int) -> np.ndarray:
    """Each row's k-th highest group maximum, NaN counted as -inf: a floor for the row's
    k-th best score, since the ``k`` groups with the highest maxima hold ``k`` distinct items
    scoring at least it."""
    finite = np.where(np.isnan(maxima), np.float32(-np.inf), maxima)
    return np.partition(finite, maxima.shape[1] - k, axis=1)[:, maxima.shape[1] - k].copy()
