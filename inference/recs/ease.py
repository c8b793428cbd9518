"""EASE: the closed-form item-item recommender (Steck, "Embarrassingly Shallow Autoencoders
for Sparse Data", WWW 2019), exact top-K with seen items masked.

With ``X`` the users x items matrix of who interacted with what (binary), EASE solves
``min ||X - X B||² + λ||B||²`` subject to ``diag(B) = 0`` in closed form::

    P = (XᵀX + λI)⁻¹,    B = I - P / diag(P)    (so B_ij = -P_ij / P_jj, B_jj = 0)

and a user's scores are ``x_user · B``: every item scored by how strongly the items the user
already took predict it. There is nothing per user to learn, so any user with history gets a
list from the current model, including users who arrived after it was trained.

The solve is dense in the catalogue: ``n²`` floats for ``B`` (1,682 items: 11 MB; 20,000:
1.6 GB) and ``O(n³)`` for the inverse (20,000 items: ~2.7 TFLOP, minutes on a CPU, seconds on
a GPU). Catalogues above ``max_items`` keep their ``max_items`` most popular items: the tail
is neither scored nor recommended, and its interactions count as unknown items.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from inference.engine.adaptive import BatchSizes
from inference.engine.device import to_device
from inference.recs.recommender_state import catalogue_from_tensors, catalogue_tensors
from inference.recs.sparse import SparseRows, Vocabulary
from inference.recs.topk import DEFAULT_BLOCK_ELEMENTS

if TYPE_CHECKING:
    import torch

# Steck's value for MovieLens-sized data; evaluation/recommendations.py measures it.
DEFAULT_L2 = 500.0
DEFAULT_MAX_ITEMS = 20_000


@dataclass(frozen=True)
class EaseConfig:
    """Settings of the EASE solve."""

    l2: float = DEFAULT_L2
    max_items: int = DEFAULT_MAX_ITEMS


def item_item_weights(
    interactions: SparseRows, n_items: int, l2: float, device: torch.device
) -> tuple[torch.Tensor, float]:
    """EASE's ``B`` (items x items, zero diagonal, float32) from binary user-item evidence.

    Args:
        interactions: (users, items) with any positive value meaning "interacted".
        n_items: columns of the catalogue.
        l2: the ridge penalty λ.
        device: where to solve.

    Returns:
        (B, seconds the solve took).
    """
    import torch

    began = time.perf_counter()
    gram = torch.zeros(n_items, n_items, dtype=torch.float64, device=device)
    # XᵀX one block of users at a time: row i of G gains the user's row for each item i they
    # took, so the work is (interactions x items), never users x items², and a block's
    # gathered rows stay within DEFAULT_BLOCK_ELEMENTS.
    lengths = interactions.row_lengths()
    ends = np.cumsum(lengths)
    per_block = max(1, DEFAULT_BLOCK_ELEMENTS // max(1, n_items))
    start = 0
    while start < interactions.n_rows:
        stop = int(np.searchsorted(ends, ends[start] - lengths[start] + per_block, "right"))
        stop = max(stop, start + 1)
        block = interactions.select(np.arange(start, min(stop, interactions.n_rows)))
        local, cols, _ = block.take(np.arange(block.n_rows))
        rows = binary_rows(block, n_items, device).double()
        gram.index_add_(0, to_device(torch.from_numpy(cols), device), rows[local])
        start = stop
    gram.diagonal().add_(l2)
    # Solved in float64: λ keeps G well conditioned, but near-tied scores should not depend on
    # rounding in the inverse.
    precision = torch.linalg.inv(gram)
    weights = precision / (-precision.diagonal())
    weights.diagonal().zero_()
    return weights.float().contiguous(), time.perf_counter() - began


def binary_rows(history: SparseRows, n_items: int, device: torch.device) -> torch.Tensor:
    """Dense 0/1 rows of ``history`` (a block of users) on ``device``: EASE's user input."""
    import torch

    local, cols, _ = history.take(np.arange(history.n_rows))
    rows = torch.zeros(history.n_rows, n_items, dtype=torch.float32)
    rows[torch.from_numpy(local), torch.from_numpy(cols)] = 1.0
    return to_device(rows, device)


@dataclass(frozen=True)
class EaseRecommender:
    """A trained EASE model: the catalogue, ``B``, item popularity, and who it was fitted on.

    ``users`` are the users of the training data; they do not decide who is ranked by the
    model (anyone with history in the catalogue is), only who counts as new to it.
    """

    users: Vocabulary
    items: Vocabulary
    item_item: torch.Tensor  # (items, items) B, zero diagonal
    popularity: torch.Tensor  # share of training interactions per item, for users with no history
    block_sizings: BatchSizes = field(
        default_factory=BatchSizes, init=False, compare=False, repr=False
    )
    # iter_top_k's cache-tiled path copies the factors into tiles on every call: for EASE the
    # "factors" are the whole n x n matrix, so whole-row topk is used instead.
    tiled: bool = field(default=False, init=False, compare=False, repr=False)

    KIND = "ease"

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The state to save as safetensors (vocabularies included, so ids survive a reload)."""
        return catalogue_tensors(self.users, self.items, self.popularity, item_item=self.item_item)

    @classmethod
    def from_tensors(
        cls,
        tensors: dict[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype | None = None,
    ) -> EaseRecommender:
        """Rebuilds a saved model on ``device``. ``B`` stays in fp32 whatever ``dtype`` is:
        its scores are sums of small weights, and bf16 would reorder near ties."""
        import torch

        del dtype
        return cls(
            **catalogue_from_tensors(tensors, device),
            item_item=tensors["item_item"].to(device, torch.float32),
        )

    def personalised(self, model_rows: np.ndarray, history: SparseRows) -> np.ndarray:
        """Who gets the model's ranking: every user with history in the catalogue."""
        del model_rows
        return history.row_lengths() > 0

    def scorer(
        self, rows: np.ndarray | None, n: int, history: SparseRows | None = None
    ) -> tuple[torch.Tensor, ...]:
        """(user rows, item factors, bias) for ``iter_top_k``: ``x_user @ B``.

        ``B.T`` is passed as the item factors, a view: ``iter_top_k`` multiplies by its
        transpose, which is ``B`` itself, so nothing n x n is copied. ``rows`` None ranks
        ``n`` users by popularity.
        """
        import torch

        device = self.item_item.device
        n_items = len(self.items)
        if rows is None or history is None:
            no_taste = torch.zeros(n, 1, device=device)
            return no_taste, torch.zeros(n_items, 1, device=device), self.popularity
        return binary_rows(history, n_items, device), self.item_item.T, None


def fit_ease(
    user_ids: np.ndarray,
    item_ids: np.ndarray,
    weights: np.ndarray,
    config: EaseConfig,
    device: torch.device,
) -> tuple[EaseRecommender, float]:
    """Builds the catalogue (the ``max_items`` most popular items) and solves EASE on it.

    Only positive weights count as evidence, as for the two-tower model; every user enters
    the training vocabulary.

    Returns:
        (model, seconds the solve took).
    """
    import torch

    user_ids, item_ids = np.asarray(user_ids, np.int64), np.asarray(item_ids, np.int64)
    positive = np.asarray(weights) > 0
    users = Vocabulary.build(user_ids)
    every_item, counts = np.unique(item_ids, return_counts=True)
    if len(every_item) > config.max_items:
        # Most popular first, ties by id, so the cut is deterministic.
        keep = np.lexsort((every_item, -counts))[: config.max_items]
        every_item, counts = every_item[keep], counts[keep]
        order = np.argsort(every_item)
        every_item, counts = every_item[order], counts[order]
    items = Vocabulary(every_item)
    matrix = SparseRows.from_pairs(
        users.index(user_ids[positive]), items.index(item_ids[positive]), len(users)
    )
    weights_b, seconds = item_item_weights(matrix, len(items), config.l2, device)
    popularity = counts.astype(np.float32) / max(1.0, float(counts.sum()))
    model = EaseRecommender(
        users=users,
        items=items,
        item_item=weights_b,
        popularity=torch.from_numpy(popularity).to(device),
    )
    return model, seconds
