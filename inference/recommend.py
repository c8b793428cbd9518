"""Two-tower recommendations: training, exact top-K with seen items masked, recall@K.

The item tower is an embedding and a bias per item. The user tower is a bag of the user's
history: ``tanh`` of the weighted sum of input embeddings of the items they interacted with.
Training maximises the multinomial likelihood of each user's interactions under a full
softmax over the catalogue (Mult-DAE style, with history dropout), so a minibatch is a block
of users and the loss is exact, without negative sampling. A shared user tower does not
overfit users with a handful of events, which free per-user embeddings did on the demo data.
Scoring is exact: ``user @ items.T + bias`` for a block of users, seen items set to ``-inf``
inside the block, then ``topk``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from inference.adaptive import BatchSizes
from inference.device import to_device
from inference.topk import DEFAULT_BLOCK_ELEMENTS, ItemTiles, grouped_fits

if TYPE_CHECKING:
    from inference.ease import EaseRecommender


@dataclass(frozen=True)
class Vocabulary:
    """Maps sparse external ids (user_id, item_id) to dense row indices and back."""

    ids: np.ndarray  # sorted, unique int64

    @classmethod
    def build(cls, ids: np.ndarray) -> Vocabulary:
        return cls(np.unique(np.asarray(ids, dtype=np.int64)))

    def __len__(self) -> int:
        return len(self.ids)

    def index(self, ids: np.ndarray) -> np.ndarray:
        """Dense indices of ``ids``; -1 where an id is not in the vocabulary."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(self.ids) == 0:
            return np.full(len(ids), -1, dtype=np.int64)
        pos = np.searchsorted(self.ids, ids).clip(max=len(self.ids) - 1)
        return np.where(self.ids[pos] == ids, pos, -1).astype(np.int64)


@dataclass(frozen=True)
class SparseRows:
    """A row-compressed (CSR) user x item matrix: seen items, targets or training weights.

    Row ``r`` holds columns ``indices[indptr[r]:indptr[r + 1]]``, sorted and unique.
    """

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray

    @classmethod
    def from_pairs(
        cls, rows: np.ndarray, cols: np.ndarray, n_rows: int, values: np.ndarray | None = None
    ) -> SparseRows:
        """Builds the matrix from (row, col[, value]) triples, summing duplicates.

        Pairs with a negative row or column (ids unknown to a vocabulary) are dropped.
        """
        rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
        vals = np.ones(len(rows)) if values is None else np.asarray(values, np.float64)
        keep = (rows >= 0) & (cols >= 0)
        rows, cols, vals = rows[keep], cols[keep], vals[keep]
        width = int(cols.max()) + 1 if len(cols) else 1
        keys, inverse = np.unique(rows * width + cols, return_inverse=True)
        summed = np.bincount(inverse, weights=vals, minlength=len(keys))
        indptr = np.zeros(n_rows + 1, dtype=np.int64)
        np.cumsum(np.bincount(keys // width, minlength=n_rows), out=indptr[1:])
        return cls(indptr, keys % width, summed.astype(np.float32))

    @property
    def n_rows(self) -> int:
        return len(self.indptr) - 1

    def row_lengths(self) -> np.ndarray:
        return np.diff(self.indptr)

    def take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Entries of the given rows as (position in ``rows``, column, value) arrays."""
        rows = np.asarray(rows, dtype=np.int64)
        starts, lengths = self.indptr[rows], self.indptr[rows + 1] - self.indptr[rows]
        local = np.repeat(np.arange(len(rows)), lengths)
        offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        pos = np.repeat(starts, lengths) + offsets
        return local, self.indices[pos], self.values[pos]

    def select(self, rows: np.ndarray) -> SparseRows:
        """The given rows, in that order, as a new matrix."""
        _, cols, vals = self.take(rows)
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(self.row_lengths()[rows], out=indptr[1:])
        return SparseRows(indptr, cols, vals)

    def minus(self, other: SparseRows) -> SparseRows:
        """Entries whose column is not in the same row of ``other`` (values dropped)."""
        local, cols, _ = self.take(np.arange(self.n_rows))
        o_local, o_cols, _ = other.take(np.arange(other.n_rows))
        width = int(max(cols.max(initial=0), o_cols.max(initial=0))) + 1
        fresh = ~np.isin(local * width + cols, o_local * width + o_cols)
        return SparseRows.from_pairs(local[fresh], cols[fresh], self.n_rows)


# -- exact top-K -----------------------------------------------------------------------------


def masked_top_k(
    scores: torch.Tensor, seen_rows: torch.Tensor, seen_cols: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` items per row of ``scores`` after setting seen (row, col) entries to -inf.

    ``scores`` is modified in place. Rows with fewer than ``k`` eligible items are padded
    with item -1 and score -inf, so the result is always (rows, k).
    """
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
    :func:`grouped_top_k`, which keeps the score matrix in cache-sized tiles; elsewhere (GPU,
    bf16, small catalogues) by a full-block ``topk``. Both are exact.

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
    if seen.n_rows != user_factors.shape[0]:
        raise ValueError(f"seen has {seen.n_rows} rows for {user_factors.shape[0]} users")
    device = user_factors.device
    grouped = (
        tiled and grouped_fits(item_factors, k) and user_factors.dtype == item_factors.dtype
    )
    tiles = ItemTiles.build(item_factors, item_bias) if grouped else None
    items_t = None if tiles else item_factors.T.contiguous()
    if tiles is not None:
        # The tiles bound their own memory; whole chunks keep every GEMM full-sized (a block
        # of 335 users would run as chunks of 256 and 79, and the small one at half speed).
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


# -- training --------------------------------------------------------------------------------


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
    # Dividing by sqrt(total weight) keeps heavy and light users on one scale without
    # erasing how much evidence each has.
    totals = np.bincount(local, vals, minlength=n_users)
    per_sample = torch.from_numpy(vals / np.sqrt(totals[local])).float().to(device)
    offsets = torch.from_numpy(np.searchsorted(local, np.arange(n_users))).to(device)
    bags = bag(torch.from_numpy(cols).to(device), offsets, per_sample_weights=per_sample)
    return torch.tanh(bags)


# -- the model as a whole --------------------------------------------------------------------


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
        return {
            "user_ids": torch.from_numpy(self.users.ids),
            "item_ids": torch.from_numpy(self.items.ids),
            "user_factors": self.user_factors.float().cpu(),
            "item_factors": self.item_factors.float().cpu(),
            "item_bias": self.item_bias.float().cpu(),
            "item_popularity": self.popularity.float().cpu(),
        }

    @classmethod
    def from_tensors(
        cls,
        tensors: dict[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ) -> Recommender:
        """Rebuilds a saved model on ``device``; factors in ``dtype``, biases in fp32."""
        return cls(
            users=Vocabulary(tensors["user_ids"].numpy()),
            items=Vocabulary(tensors["item_ids"].numpy()),
            user_factors=tensors["user_factors"].to(device, dtype),
            item_factors=tensors["item_factors"].to(device, dtype),
            item_bias=tensors["item_bias"].to(device, torch.float32),
            popularity=tensors["item_popularity"].to(device, torch.float32),
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


# -- scoring and evaluation ------------------------------------------------------------------


@dataclass(frozen=True)
class RecommendationBatch:
    """Recommendation rows for one block of users, flat: one row per (user, rank)."""

    user_ids: np.ndarray
    ranks: np.ndarray  # 1..n per user, contiguous, n = k unless too few items are left
    item_ids: np.ndarray
    scores: np.ndarray  # float32, descending within a user
    users: int
    users_short_of_k: int
    cold_start: bool  # ranked by popularity: the model has never seen these users
    seconds: float


def recommend(
    model: Recommender | EaseRecommender,
    user_ids: np.ndarray,
    seen: tuple[np.ndarray, np.ndarray],
    k: int,
    block_size: int,
) -> Iterator[RecommendationBatch]:
    """Top-``k`` unseen items for each user: by the model where it can rank them (two-tower:
    users it was trained on; EASE: users with history in the catalogue), else by popularity.

    Args:
        model: the trained recommender (two-tower or EASE), on the compute device.
        user_ids: users to recommend for (duplicates are ignored).
        seen: (user_ids, item_ids) of their history; these items are never recommended.
            Pairs of other users, or of items outside the model's catalogue, are ignored.
        k: recommendations per user.
        block_size: users per scoring block.
    """
    user_ids = np.unique(np.asarray(user_ids, dtype=np.int64))
    rows = Vocabulary(user_ids).index(seen[0])
    history = SparseRows.from_pairs(rows, model.items.index(seen[1]), len(user_ids))
    model_rows = model.users.index(user_ids)
    personal = model.personalised(model_rows, history)
    for cold_start in (False, True):
        members = np.flatnonzero(personal != cold_start)
        if len(members) == 0:
            continue
        seen = history.select(members)
        scorer = model.scorer(None if cold_start else model_rows[members], len(members), seen)
        blocks = iter_top_k(
            *scorer, seen, k, block_size, model.block_sizings, tiled=model.tiled
        )
        for block in blocks:
            valid = block.items >= 0
            counts = valid.sum(axis=1)
            block_users = user_ids[members[block.start : block.start + len(block.items)]]
            yield RecommendationBatch(
                user_ids=np.repeat(block_users, counts),
                ranks=np.nonzero(valid)[1] + 1,
                item_ids=model.items.ids[block.items[valid]],
                scores=block.scores[valid],
                users=len(block_users),
                users_short_of_k=int((counts < k).sum()),
                cold_start=cold_start,
                seconds=block.seconds,
            )


def recall_at_k(recommended: np.ndarray, relevant: SparseRows) -> tuple[float, int]:
    """Mean over users with any relevant item of hits / min(k, number of relevant items).

    Returns:
        (recall, number of users it averages over).
    """
    k = recommended.shape[1]
    lengths = relevant.row_lengths()
    users = np.flatnonzero(lengths > 0)
    if len(users) == 0:
        return 0.0, 0
    local, cols, _ = relevant.take(users)
    hit = (recommended[users[local]] == cols[:, None]).any(axis=1)
    hits = np.bincount(local, weights=hit, minlength=len(users))
    return float(np.mean(hits / np.minimum(k, lengths[users]))), len(users)


@dataclass(frozen=True)
class HoldoutRecall:
    """Recall@K on a held-out day: the model against a popularity ranking."""

    model: float
    popularity: float
    users: int
    k: int


def holdout_recall(
    model: Recommender | EaseRecommender,
    history: tuple[np.ndarray, np.ndarray],
    holdout: tuple[np.ndarray, np.ndarray],
    k: int = 20,
    block_size: int = 4096,
) -> HoldoutRecall:
    """Recall@k of the model and of popularity on items users first took on a later day.

    Both rankings exclude the user's history; they are judged on users the model knows who
    interacted with at least one catalogue item on the held-out day that they had not before.

    Args:
        model: trained on ``history``.
        history: (user_ids, item_ids) the model was trained on.
        holdout: (user_ids, item_ids) of the held-out day.
        k: list length.
        block_size: users per scoring block.
    """
    n = len(model.users)
    seen = SparseRows.from_pairs(model.users.index(history[0]), model.items.index(history[1]), n)
    later = SparseRows.from_pairs(model.users.index(holdout[0]), model.items.index(holdout[1]), n)
    relevant = later.minus(seen)
    users = np.flatnonzero(relevant.row_lengths() > 0)
    seen_users, relevant_users = seen.select(users), relevant.select(users)
    scorer = model.scorer(users, len(users), seen_users)
    _, ranked = top_k(*scorer, seen_users, k, block_size, tiled=model.tiled)
    _, popular = top_k(*model.scorer(None, len(users)), seen_users, k, block_size, model.tiled)
    return HoldoutRecall(
        model=recall_at_k(ranked, relevant_users)[0],
        popularity=recall_at_k(popular, relevant_users)[0],
        users=len(users),
        k=k,
    )
