"""The GEMM engine and tile shape of the CPU top-K (``inference.recs.topk``).

The engine is chosen by what this torch has, never by timing: oneDNN and numpy's BLAS round
differently, so which of them scored a near-tie decides its order, and every process scoring
the same day (a Ray actor, a resumed run) must rank it alike. The tile shape is fixed: the
shapes measured scored within noise of each other under AVX2 and AVX-512 alike (docs/benchmarks.md,
"Top-K on an AVX2-only CPU"), so timing them in every process bought nothing for its cost.
oneDNN's scores do not depend on the shape (tested), so changing it changes no ranking.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

Gemm = Callable[["torch.Tensor", "torch.Tensor"], np.ndarray]

# Items in a group whose maximum is kept per tile; a tile is a whole number of groups.
GROUP_ITEMS = 32


def onednn_scores(users: torch.Tensor, tile: torch.Tensor) -> np.ndarray:
    """``users @ tile.T`` by oneDNN (the widest vectors the CPU has), as a fresh array."""
    import torch

    return torch.ops.mkldnn._linear_pointwise(users, tile, None, "none", [], "").numpy()


def blas_scores(users: torch.Tensor, tile: torch.Tensor) -> np.ndarray:
    """``users @ tile.T`` by numpy's BLAS: the engine where torch lacks oneDNN."""
    return np.matmul(users.numpy(), tile.numpy().T)


ENGINES: dict[str, Gemm] = {"onednn": onednn_scores, "blas": blas_scores}


@dataclass(frozen=True)
class Kernel:
    """How item tiles are scored: the GEMM engine and the shape of one tile of scores.

    ``chunk_users`` rows times ``tile_items`` columns is the score tile that the selection
    reads while it is still in cache.
    """

    engine: str
    chunk_users: int
    tile_items: int

    @property
    def gemm(self) -> Gemm:
        return ENGINES[self.engine]

    @property
    def groups(self) -> int:
        """Groups per tile: group ``g`` holds items ``g, g + groups, g + 2 * groups, ...``."""
        return self.tile_items // GROUP_ITEMS

    def packed(self, tiles: list[torch.Tensor]) -> list[torch.Tensor]:
        """The tiles in oneDNN's weight layout for ``chunk_users`` rows, or as they were.

        Packing once here spares oneDNN a reorder of the tile on every GEMM.
        """
        import torch

        if self.engine != "onednn":
            return tiles
        try:
            packed = [torch.ops.mkldnn._reorder_linear_weight(t, self.chunk_users) for t in tiles]
            probe = torch.ones(2, tiles[0].shape[1])
            if np.array_equal(onednn_scores(probe, packed[0]), onednn_scores(probe, tiles[0])):
                return packed
        except (AttributeError, RuntimeError, NotImplementedError):
            pass
        return tiles


# (chunk_users, tile_items): the score tile the selection reads right after its GEMM. Fewer
# than 256 users per chunk starve the GEMM and repeat each chunk's fixed cost (the seen-item
# layout, the final ranking) more often; more users measured no faster and double the tile
# every chunk keeps in cache.
SHAPE = (256, 2048)
MAX_TILE_ITEMS = SHAPE[1]


@cache
def engine() -> str:
    """oneDNN if this torch has it and it agrees with numpy on a small product, else BLAS."""
    import torch

    try:
        if torch.backends.mkldnn.is_available():
            rng = np.random.default_rng(0)
            u = torch.from_numpy(rng.standard_normal((5, 9), dtype=np.float32))
            t = torch.from_numpy(rng.standard_normal((7, 9), dtype=np.float32))
            got = onednn_scores(u, t)
            if got.shape == (5, 7) and np.allclose(got, blas_scores(u, t), atol=1e-4):
                return "onednn"
    except (AttributeError, RuntimeError, NotImplementedError):
        pass
    return "blas"


def default_kernel() -> Kernel:
    """This process's engine at the fixed tile shape."""
    return Kernel(engine(), *SHAPE)
