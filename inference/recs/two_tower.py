"""The two-tower recommender: its training and the trained model.

The item tower is an embedding and a bias per item. The user tower is a bag of the user's
history: ``tanh`` of the weighted sum of input embeddings of the items they interacted with.
Training maximises the multinomial likelihood of each user's interactions under a full
softmax over the catalogue (Mult-DAE style, with history dropout), so a minibatch is a block
of users and the loss is exact, without negative sampling. A shared user tower does not
overfit users with a handful of events, which free per-user embeddings did on the demo data.
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

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of the two-tower model (chosen on the demo data, see the tests)."""

    dims: int = 64
    epochs: int = 10
    batch_users: int = 1024
    learning_rate: float = 0.02
    keep: float = 0.5  # share of a user's history the tower sees in each training step
    seed: int = 0


@dataclass
class Factors:
    """Trained embeddings: users' tower outputs over their full history, items, item bias."""

    users: torch.Tensor
    items: torch.Tensor
    item_bias: torch.Tensor
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


def train_factors(
    interactions: SparseRows, n_items: int, config: TrainConfig, device: torch.device
) -> Factors:
    """Fits the two towers to users' interaction distributions.

    Args:
        interactions: (users, items) summed positive event weights; a user's row, damped
            with log1p and normalised, is the distribution the model learns to predict.
        n_items: catalogue size (columns).
        config: hyper-parameters.
        device: where to train.

    Returns:
        Factors with one user embedding per row of ``interactions`` (zeros for empty rows).
    """
    import torch

    began = time.perf_counter()
    generator = torch.Generator().manual_seed(config.seed)
    history = torch.nn.EmbeddingBag(n_items, config.dims, mode="sum").to(device)
    with torch.no_grad():
        history.weight.copy_(torch.randn(n_items, config.dims, generator=generator) * 0.05)
    items = torch.randn(n_items, config.dims, generator=generator).to(device) * 0.05
    items = torch.nn.Parameter(items)
    bias = torch.nn.Parameter(torch.zeros(n_items, device=device))
    params = [history.weight, items, bias]
    optimiser = torch.optim.Adam(params, lr=config.learning_rate, fused=True)
    weights = SparseRows(interactions.indptr, interactions.indices, np.log1p(interactions.values))
    active = np.flatnonzero(interactions.row_lengths() > 0)
    losses: list[float] = []
    for _ in range(config.epochs):
        order = active[torch.randperm(len(active), generator=generator).numpy()]
        total = 0.0
        for start in range(0, len(order), config.batch_users):
            batch = order[start : start + config.batch_users]
            local, cols, vals = weights.take(batch)
            keep = torch.rand(len(cols), generator=generator).numpy() < config.keep
            user = _user_tower(history, local[keep], cols[keep], vals[keep], len(batch), device)
            target = torch.from_numpy(vals / np.bincount(local, vals)[local]).float().to(device)
            logits = user @ items.T + bias
            # Cross-entropy against the user's distribution without materialising it: the
            # log-normaliser over all items minus the target-weighted logits of their items.
            taken = logits[torch.from_numpy(local).to(device), torch.from_numpy(cols).to(device)]
            loss = (torch.logsumexp(logits, dim=1).sum() - (target * taken).sum()) / len(batch)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            total += float(loss.detach()) * len(batch)
        losses.append(total / max(1, len(order)))
    with torch.no_grad():
        users = torch.zeros(interactions.n_rows, config.dims, device=device)
        for start in range(0, interactions.n_rows, 4096):
            rows = np.arange(start, min(start + 4096, interactions.n_rows))
            users[start : start + len(rows)] = _user_tower(
                history, *weights.take(rows), len(rows), device
            )
    return Factors(users, items.detach(), bias.detach(), losses, time.perf_counter() - began)


def _user_tower(
    bag: torch.nn.EmbeddingBag,
    local: np.ndarray,
    cols: np.ndarray,
    vals: np.ndarray,
    n_users: int,
    device: torch.device,
) -> torch.Tensor:
    import torch

    # Dividing by sqrt(total weight) keeps heavy and light users on one scale without
    # erasing how much evidence each has.
    totals = np.bincount(local, vals, minlength=n_users)
    per_sample = torch.from_numpy(vals / np.sqrt(totals[local])).float().to(device)
    offsets = torch.from_numpy(np.searchsorted(local, np.arange(n_users))).to(device)
    bags = bag(torch.from_numpy(cols).to(device), offsets, per_sample_weights=per_sample)
    return torch.tanh(bags)


@dataclass(frozen=True)
class Recommender:
    """A trained model: vocabularies, user and item embeddings, item bias and popularity."""

    users: Vocabulary
    items: Vocabulary
    user_factors: torch.Tensor
    item_factors: torch.Tensor
    item_bias: torch.Tensor
    popularity: torch.Tensor  # share of training interactions per item, for cold-start users
    # Users per top-K block that fit the device, per configured block size (see iter_top_k).
    block_sizings: BatchSizes = field(
        default_factory=BatchSizes, init=False, compare=False, repr=False
    )
    tiled: bool = field(default=True, init=False, compare=False, repr=False)

    KIND = "two_tower"

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The state to save as safetensors (vocabularies included, so ids survive a reload)."""
        return catalogue_tensors(
            self.users,
            self.items,
            self.popularity,
            user_factors=self.user_factors,
            item_factors=self.item_factors,
            item_bias=self.item_bias,
        )

    @classmethod
    def from_tensors(
        cls,
        tensors: dict[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype | None = None,
    ) -> Recommender:
        """Rebuilds a saved model on ``device``; factors in ``dtype`` (fp32 unless given),
        biases in fp32."""
        import torch

        dtype = dtype or torch.float32
        return cls(
            **catalogue_from_tensors(tensors, device),
            user_factors=tensors["user_factors"].to(device, dtype),
            item_factors=tensors["item_factors"].to(device, dtype),
            item_bias=tensors["item_bias"].to(device, torch.float32),
        )

    def personalised(self, model_rows: np.ndarray, history: SparseRows) -> np.ndarray:
        """Who gets the model's ranking: users it has an embedding for (``model_rows >= 0``)."""
        del history
        return model_rows >= 0

    def scorer(
        self, rows: np.ndarray | None, n: int, history: SparseRows | None = None
    ) -> tuple[torch.Tensor, ...]:
        """(user factors, item factors, item bias) for ``iter_top_k``.

        ``rows`` are model user rows; None ranks ``n`` users by popularity alone (a zero taste
        vector leaves only the bias), the fallback for users the model has never seen. The
        towers were run over the history at training time, so ``history`` is not needed.
        """
        import torch

        device, dtype = self.item_factors.device, self.item_factors.dtype
        if rows is None:
            no_taste = torch.zeros(n, 1, device=device, dtype=dtype)
            no_items = torch.zeros(len(self.items), 1, device=device, dtype=dtype)
            return no_taste, no_items, self.popularity
        rows_t = to_device(torch.from_numpy(np.asarray(rows, dtype=np.int64)), device)
        return self.user_factors[rows_t], self.item_factors, self.item_bias


def fit_recommender(
    user_ids: np.ndarray,
    item_ids: np.ndarray,
    weights: np.ndarray,
    config: TrainConfig,
    device: torch.device,
) -> tuple[Recommender, Factors]:
    """Builds vocabularies from interaction triples and trains the model on them.

    Every user and item in the triples enters the vocabulary; only positive weights count
    as evidence of taste, so a user whose events all weigh zero is ranked by bias alone.
    """
    import torch

    users, items = Vocabulary.build(user_ids), Vocabulary.build(item_ids)
    positive = np.asarray(weights) > 0
    matrix = SparseRows.from_pairs(
        users.index(user_ids[positive]),
        items.index(item_ids[positive]),
        len(users),
        weights[positive],
    )
    factors = train_factors(matrix, len(items), config, device)
    counts = np.bincount(items.index(item_ids), minlength=len(items)).astype(np.float32)
    model = Recommender(
        users=users,
        items=items,
        user_factors=factors.users,
        item_factors=factors.items,
        item_bias=factors.item_bias,
        popularity=torch.from_numpy(counts / max(1.0, counts.sum())).to(device),
    )
    return model, factors
