"""Exact top-K over a large catalogue on the CPU, in cache-sized tiles.

``inference.recommend.iter_top_k`` uses this for fp32 factors on the CPU when the catalogue
is large; GPUs and small catalogues rank whole rows with ``torch.topk``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

# Score-matrix elements per block (x4 bytes): large enough to keep the matmul efficient,
# small enough that a 1M-item catalogue still scores in blocks of a few hundred MB.
DEFAULT_BLOCK_ELEMENTS = 1 << 24

# Grouped top-K on the CPU. A 256-user chunk times a 2,048-item tile of scores is 2 MB, so the
# GEMM writes it into cache and the group maxima read it back from there; groups of 32 items
# make the candidate set k x 32 per user. Measured on a 2-core EPYC (benchmarks/results.md):
# about 2x faster than topk over whole rows of 50k items. Small catalogues gain nothing.
# The tile GEMMs go through numpy's OpenBLAS (the BLAS faiss uses too): on this AMD CPU it
# ran these shapes 10-20% faster than torch's MKL. The bias rides along as one more
# dimension (users get a constant 1), so one GEMM yields the final scores.
TILE_ITEMS = 2048
GROUP_ITEMS = 32
CHUNK_USERS = 256
GROUPED_MIN_ITEMS = 8 * TILE_ITEMS


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
    """Item factors cut into GEMM tiles, with the bias per tile (-inf on padding columns).

    Exactness of :meth:`top_k` rests on one fact: the ``k`` groups with the highest maxima
    hold every one of a row's ``k`` highest scores. (Each of the top ``k`` scores lies in a
    group whose maximum is at least the k-th score, and at most ``k`` groups can have such
    a maximum, since each needs its own score at least that high.) Seen items are set to
    -inf before the group maxima that contain them are taken, so exclusion is exact too.
    """

    tiles: list[np.ndarray]  # (dims + 1, TILE_ITEMS) float32 each, the last row the bias
    n_items: int
    # Score and group-maximum buffers, allocated on first use and reused by every block:
    # a fresh 50 MB buffer per block of users costs more in page faults than the selection.
    _buffers: list[torch.Tensor] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def build(cls, item_factors: torch.Tensor, item_bias: torch.Tensor | None) -> ItemTiles:
        n_items, dims = item_factors.shape
        padded = -(-n_items // TILE_ITEMS) * TILE_ITEMS
        # Padding columns score -inf: zero factors, -inf bias (times the users' constant 1).
        factors = np.zeros((dims + 1, padded), dtype=np.float32)
        factors[:dims, :n_items] = item_factors.T.numpy()
        factors[dims, n_items:] = -np.inf
        if item_bias is not None:
            factors[dims, :n_items] = item_bias.float().numpy()
        cut = range(0, padded, TILE_ITEMS)
        return cls([np.ascontiguousarray(factors[:, j : j + TILE_ITEMS]) for j in cut], n_items)

    def chunk_users(self) -> int:
        """Users per chunk, so that a chunk's scores stay within the block memory budget."""
        padded = len(self.tiles) * TILE_ITEMS
        return max(8, min(CHUNK_USERS, DEFAULT_BLOCK_ELEMENTS // padded))

    def top_k(
        self, users: torch.Tensor, rows: np.ndarray, cols: np.ndarray, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-``k`` of ``users @ items.T + bias`` with (rows, cols) excluded.

        Args:
            users: (n, dims) user factors.
            rows, cols: seen entries, ``rows`` local to ``users`` and sorted.
            k: items per user.

        Returns:
            (scores, items), each (n, k), descending; -inf and -1 where fewer are eligible.
        """
        from threadpoolctl import threadpool_limits

        chunk = self.chunk_users()
        if not self._buffers:
            self._buffers.append(torch.empty(len(self.tiles), chunk, TILE_ITEMS))
            self._buffers.append(torch.empty(chunk, len(self.tiles) * (TILE_ITEMS // GROUP_ITEMS)))
        scores, groups = self._buffers
        bounds = np.searchsorted(rows, np.arange(0, len(users) + chunk, chunk))
        augmented = np.ones((len(users), users.shape[1] + 1), dtype=np.float32)
        augmented[:, :-1] = users.numpy()
        values, items = [], []
        # numpy's BLAS runs on as many threads as torch was given, no more.
        with threadpool_limits(limits=torch.get_num_threads(), user_api="blas"):
            for c, start in enumerate(range(0, len(users), chunk)):
                seen = slice(bounds[c], bounds[c + 1])
                v, i = self._chunk(
                    augmented[start : start + chunk],
                    rows[seen] - start,
                    cols[seen],
                    k,
                    scores,
                    groups,
                )
                values.append(v)
                items.append(i)
        if not values:
            return torch.empty(0, k), torch.empty(0, k, dtype=torch.long)
        return torch.cat(values), torch.cat(items)

    def _chunk(
        self,
        users: np.ndarray,
        rows: np.ndarray,
        cols: np.ndarray,
        k: int,
        scores: torch.Tensor,
        groups: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, per_tile = len(users), TILE_ITEMS // GROUP_ITEMS
        raw = scores.numpy()
        for j, tile in enumerate(self.tiles):
            np.matmul(users, tile, out=raw[j, :n])
            out = scores[j, :n]
            torch.amax(
                out.view(n, per_tile, GROUP_ITEMS),
                dim=2,
                out=groups[:n, j * per_tile : (j + 1) * per_tile],
            )
        grouped = scores.view(len(self.tiles), scores.shape[1], per_tile, GROUP_ITEMS)
        if len(cols):
            rows_t, cols_t = torch.from_numpy(rows), torch.from_numpy(cols)
            scores[cols_t // TILE_ITEMS, rows_t, cols_t % TILE_ITEMS] = float("-inf")
            # Only the groups holding a seen item need their maximum taken again.
            hit = torch.unique(rows_t * groups.shape[1] + cols_t // GROUP_ITEMS)
            r, g = hit // groups.shape[1], hit % groups.shape[1]
            groups[r, g] = grouped[g // per_tile, r, g % per_tile].amax(dim=1)
        _, best = torch.topk(groups[:n], k, dim=1, sorted=False)
        candidates = grouped[best // per_tile, torch.arange(n)[:, None], best % per_tile]
        values, position = torch.topk(candidates.reshape(n, -1), k, dim=1)
        item_ids = (best * GROUP_ITEMS)[:, :, None] + torch.arange(GROUP_ITEMS)
        item_ids = item_ids.reshape(n, -1).gather(1, position)
        return values, item_ids.masked_fill(torch.isneginf(values), -1)
