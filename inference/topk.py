"""Exact top-K over a large catalogue on the CPU, in cache-sized tiles.

``inference.topk_blocks.iter_top_k`` uses this for fp32 factors on the CPU when the catalogue
is large; GPUs and small catalogues rank whole rows with ``torch.topk``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

# Score-matrix elements per block (x4 bytes): large enough to keep the matmul efficient,
# small enough that a 1M-item catalogue still scores in blocks of a few hundred MB.
DEFAULT_BLOCK_ELEMENTS = 1 << 24

# Grouped top-K on the CPU: a 256-user chunk times a 2,048-item tile of scores (2 MB) is
# scored, its seen items set to -inf, and reduced to maxima over groups of 32 items, while
# the tile is still in cache; only groups that can still reach the user's top k are kept.
# The bias rides along as one more dimension (users get a constant 1), so one GEMM yields
# the final scores.
#
# Measured on the 2-core AMD EPYC (Zen 5, AVX-512; 1 MB L2 a core) with one thread, 20k users
# x 50k items x 64 dims, K=20; variants alternated in one process, then the benchmark
# (`NIGHTSHIFT_CPU_THREADS=1 .venv/bin/python -m benchmarks.bench --only recs --out DIR`):
#   - the previous version (GEMM into a 50 MB per-chunk buffer, out of L3; torch.topk twice;
#     torch.unique for the seen groups) 1.78 s, faiss IndexFlatIP (no exclusion) 1.52 s.
#   - the GEMM: numpy's OpenBLAS runs its AVX2 ("Haswell") kernel on this CPU, 1.05-1.15 s
#     for all the scores; MKL (torch.mm) 1.26 s; oneDNN (torch.ops.mkldnn._linear_pointwise)
#     runs AVX-512, 0.53-0.61 s, near the core's peak. oneDNN is used wherever torch has it,
#     with the tiles packed in its layout once (0.90 s against 0.96 s unpacked).
#   - torch.topk on the CPU costs ~2 us a row (0.5 ms for 256 x 276); numpy's sort, AVX-512
#     too, 67 us. The per-tile threshold and the final ranking therefore run in numpy.
#   - tiles of 2,048 items beat 4,096 and 8,192 (the group maxima then read an L2-sized
#     tile: 0.07 s against 0.11 s and 0.26 s in all); 1,024 x 512 users was within noise;
#     256 x 1,024 and 128 x 2,048 were slower (more, smaller GEMMs); groups of 16 or 64 were
#     no faster than 32.
#   - this version: 0.88 s against faiss 1.52 s alternated (1.74x; 1.44 s, 1.06x, on the
#     numpy BLAS fallback); in the benchmark 0.92 s against faiss 1.61 s (1.75x), the bare
#     oneDNN GEMM of the same tiles 0.61 s.
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


def _onednn_scores(users: torch.Tensor, tile: torch.Tensor) -> np.ndarray:
    """``users @ tile.T`` by oneDNN (AVX-512 where the CPU has it), as a fresh array."""
    return torch.ops.mkldnn._linear_pointwise(users, tile, None, "none", [], "").numpy()


def _blas_scores(users: torch.Tensor, tile: torch.Tensor) -> np.ndarray:
    """``users @ tile.T`` by numpy's BLAS: the fallback where torch lacks oneDNN."""
    return np.matmul(users.numpy(), tile.numpy().T)


_CHOSEN: list[Callable[[torch.Tensor, torch.Tensor], np.ndarray]] = []


def _pick_gemm() -> Callable[[torch.Tensor, torch.Tensor], np.ndarray]:
    """oneDNN if this torch has it and it agrees with numpy on a small product, else BLAS."""
    if not _CHOSEN:
        chosen = _blas_scores
        try:
            if torch.backends.mkldnn.is_available():
                rng = np.random.default_rng(0)
                u = torch.from_numpy(rng.standard_normal((5, 9), dtype=np.float32))
                t = torch.from_numpy(rng.standard_normal((7, 9), dtype=np.float32))
                got = _onednn_scores(u, t)
                if got.shape == (5, 7) and np.allclose(got, _blas_scores(u, t), atol=1e-4):
                    chosen = _onednn_scores
        except (AttributeError, RuntimeError, NotImplementedError):
            pass
        _CHOSEN.append(chosen)
    return _CHOSEN[0]


def _packed(tiles: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tiles in oneDNN's own weight layout for CHUNK_USERS rows, or as they were.

    Packed once here instead of on every GEMM: 0.90 s against 0.96 s on the benchmark.
    """
    try:
        packed = [torch.ops.mkldnn._reorder_linear_weight(t, CHUNK_USERS) for t in tiles]
        probe = torch.ones(2, tiles[0].shape[1])
        if np.array_equal(_onednn_scores(probe, packed[0]), _onednn_scores(probe, tiles[0])):
            return packed
    except (AttributeError, RuntimeError, NotImplementedError):
        pass
    return tiles


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
    Ranking them by (score descending, item ascending) gives the brute-force order exactly.
    """

    # (TILE_ITEMS, dims + 1) float32 each, the last column the bias; in oneDNN's layout
    # when oneDNN is the GEMM.
    tiles: list[torch.Tensor]
    n_items: int
    _gemm: Callable[[torch.Tensor, torch.Tensor], np.ndarray] = field(
        default_factory=_pick_gemm, compare=False, repr=False
    )

    @classmethod
    def build(cls, item_factors: torch.Tensor, item_bias: torch.Tensor | None) -> ItemTiles:
        n_items, dims = item_factors.shape
        padded = -(-n_items // TILE_ITEMS) * TILE_ITEMS
        # Padding items score -inf: zero factors, -inf bias (times the users' constant 1).
        factors = np.zeros((padded, dims + 1), dtype=np.float32)
        factors[:n_items, :dims] = item_factors.numpy()
        factors[n_items:, dims] = -np.inf
        if item_bias is not None:
            factors[:n_items, dims] = item_bias.float().numpy()
        cut = range(0, padded, TILE_ITEMS)
        tiles = [torch.from_numpy(factors[j : j + TILE_ITEMS].copy()) for j in cut]
        gemm = _pick_gemm()
        if gemm is _onednn_scores:
            tiles = _packed(tiles)
        return cls(tiles, n_items, gemm)

    def chunk_users(self) -> int:
        """Users per chunk: a chunk's working set is one tile of scores, whatever the items."""
        return CHUNK_USERS

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
        augmented = np.ones((len(users), users.shape[1] + 1), dtype=np.float32)
        augmented[:, :-1] = users.numpy()
        augmented_t = torch.from_numpy(augmented)
        values, items = [], []
        # oneDNN runs on torch's threads; numpy's BLAS (the fallback) is held to as many. The
        # limit is only set for BLAS: threadpoolctl reads /proc/self/maps each time, and per
        # 256-user block that was 0.08 s of the benchmark's 1.0 s.
        limit = contextlib.nullcontext()
        if self._gemm is _blas_scores:
            from threadpoolctl import threadpool_limits

            limit = threadpool_limits(limits=torch.get_num_threads(), user_api="blas")
        with limit:
            for c, start in enumerate(range(0, len(users), chunk)):
                seen = slice(bounds[c], bounds[c + 1])
                v, i = self._chunk(
                    augmented_t[start : start + chunk], rows[seen] - start, cols[seen], k
                )
                values.append(v)
                items.append(i)
        if not values:
            return torch.empty(0, k), torch.empty(0, k, dtype=torch.long)
        return torch.from_numpy(np.concatenate(values)), torch.from_numpy(np.concatenate(items))

    def _chunk(
        self, users: torch.Tensor, rows: np.ndarray, cols: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        n, width = len(users), TILE_ITEMS // GROUP_ITEMS
        # Seen entries as flat positions in their tile's (n, TILE_ITEMS) scores, by tile.
        tile_of = cols // TILE_ITEMS
        order = np.argsort(tile_of, kind="stable")
        flat = (rows * TILE_ITEMS + cols % TILE_ITEMS)[order]
        cuts = np.searchsorted(tile_of[order], np.arange(len(self.tiles) + 1))
        # Columns [0, k) hold the k highest group maxima so far, [k, k + width) the tile's.
        maxima = np.full((n, k + width), -np.inf, dtype=np.float32)
        tile_maxima = maxima[:, k:]
        kept_rows, kept_base, kept_scores = [], [], []
        for j, tile in enumerate(self.tiles):
            scores = self._gemm(users, tile)
            if cuts[j + 1] > cuts[j]:
                scores.reshape(-1)[flat[cuts[j] : cuts[j + 1]]] = -np.inf
            # Group g of a tile is items g, g + width, g + 2 * width, ...: its maximum is an
            # element-wise maximum of contiguous rows, which vectorises. torch.amax: 46 us a
            # tile, against 76 us for groups of adjacent items and 127-227 us for numpy.
            grouped = scores.reshape(n, GROUP_ITEMS, width)
            torch.amax(torch.from_numpy(grouped), dim=1, out=torch.from_numpy(tile_maxima))
            ranked = np.sort(maxima, axis=1)
            maxima[:, :k] = ranked[:, -k:]
            hit = np.flatnonzero(tile_maxima >= ranked[:, -k, None])
            r, g = np.divmod(hit, width)
            kept_rows.append(r)
            kept_base.append(j * TILE_ITEMS + g)
            kept_scores.append(grouped[r, :, g])
        # Items of the kept groups scoring at least the final k-th group maximum.
        rows_k, base, kept = map(np.concatenate, (kept_rows, kept_base, kept_scores))
        hit = np.flatnonzero(kept >= maxima[rows_k, :1])
        group, member = np.divmod(hit, GROUP_ITEMS)
        owner, value = rows_k[group], kept.reshape(-1)[hit]
        item = base[group] + member * width
        owner, value, item = _ranked(owner, value, item)
        # The first k of each user's run; fewer only if the maxima were NaN.
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
    """Sorted by owner, then score descending, then item: one int64 key sort (AVX-512 in
    numpy; ~10x ``np.lexsort`` on these sizes), with ``lexsort`` only where scores tie."""
    bits = (value + np.float32(0)).view(np.int32)  # + 0 makes -0.0 into 0.0
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # int32 order == float order
    key = (owner.astype(np.int64) << 32) + (np.int64(0x7FFFFFFF) - ordered)
    order = np.argsort(key)
    if np.any(np.diff(key[order]) == 0):
        order = np.lexsort((item, -value, owner))
    return owner[order], value[order], item[order]
