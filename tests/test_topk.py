"""The cache-tiled grouped top-K (inference/recs/topk.py) against brute force, on edge cases,
for the fixed tile shape and other shapes, and its norm-ordered item layout.

Factors are small integers, so every score is exact in fp32 whatever the GEMM's summation
order: ties are common and must come out as brute force ranks them (lowest item first).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from inference.recs import topk_kernels
from inference.recs.topk import GROUPED_MIN_ITEMS, ItemTiles
from inference.recs.topk_kernels import GROUP_ITEMS, MAX_TILE_ITEMS, Kernel, default_kernel

TILE_ITEMS = MAX_TILE_ITEMS
# Other shapes than the fixed one, whose tiles divide it: the algorithm must not depend on it.
OTHER_SHAPES = ((512, 2048), (128, 1024), (512, 1024))


def brute_force(scores: np.ndarray, seen: list[set[int]], k: int) -> tuple[np.ndarray, np.ndarray]:
    values = np.full((len(scores), k), -np.inf, dtype=np.float32)
    items = np.full((len(scores), k), -1, dtype=np.int64)
    for user, (row, banned) in enumerate(zip(scores, seen, strict=True)):
        eligible = np.ones(len(row), dtype=bool)
        eligible[list(banned)] = False
        order = np.argsort(-row, kind="stable")
        order = order[eligible[order] & np.isfinite(row[order])][:k]
        values[user, : len(order)] = row[order]
        items[user, : len(order)] = order
    return values, items


def shapes() -> list[Kernel]:
    """The fixed kernel first, then the other shapes on the same engine."""
    default = default_kernel()
    return [default, *(Kernel(default.engine, *shape) for shape in OTHER_SHAPES)]


def engines(items: torch.Tensor, bias: torch.Tensor | None) -> list[ItemTiles]:
    """The tiles for the fixed shape (oneDNN where torch has it), other shapes, and numpy's
    BLAS engine at the fixed shape."""
    kernels = [*shapes(), Kernel("blas", *topk_kernels.SHAPE)]
    return [ItemTiles.build(items, bias, k) for k in dict.fromkeys(kernels)]


def gemm_scores(tiles: ItemTiles, augmented: torch.Tensor) -> np.ndarray:
    """All scores by item id, chunk by chunk and tile by tile, as the tiles' GEMM computes
    them (the tiles hold the items in norm order)."""
    step, gemm = tiles.kernel.chunk_users, tiles.kernel.gemm
    chunks = [augmented[s : s + step] for s in range(0, len(augmented), step)]
    by_position = np.concatenate(
        [np.concatenate([gemm(c, t) for t in tiles.tiles], axis=1) for c in chunks]
    )
    return by_position[:, tiles.positions]


def integer_problem(rng, n_users: int, n_items: int, dims: int, with_bias: bool):
    users = torch.from_numpy(rng.integers(-2, 3, (n_users, dims)).astype(np.float32))
    items = torch.from_numpy(rng.integers(-2, 3, (n_items, dims)).astype(np.float32))
    bias = torch.from_numpy(rng.integers(-3, 4, n_items).astype(np.float32)) if with_bias else None
    scores = (users @ items.T).numpy() + (bias.numpy() if with_bias else 0)
    return users, items, bias, scores


def run(tiles: ItemTiles, users: torch.Tensor, seen: list[set[int]], k: int):
    rows = np.repeat(np.arange(len(seen)), [len(s) for s in seen]).astype(np.int64)
    cols = np.array([i for s in seen for i in sorted(s)], dtype=np.int64)
    values, items = tiles.top_k(users, rows, cols, k)
    return values.numpy(), items.numpy()


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("k", [1, 20])
def test_ties_padding_and_exhausted_users_match_brute_force(with_bias: bool, k: int) -> None:
    rng = np.random.default_rng(3)
    # Not a multiple of the tile (padding items) nor of the 256-user chunk.
    n_users, n_items, dims = 300, GROUPED_MIN_ITEMS + 777, 3
    users, items, bias, scores = integer_problem(rng, n_users, n_items, dims, with_bias)
    seen = [set(rng.integers(0, n_items, rng.integers(0, 40)).tolist()) for _ in range(n_users)]
    # Seen items on tile and group boundaries, and the user's own best items.
    # Boundaries of the smaller candidate tiles too (they divide the largest).
    seen[3] |= {0, TILE_ITEMS - 1, TILE_ITEMS, 2 * TILE_ITEMS - 1, n_items - 1, GROUP_ITEMS}
    seen[3] |= {TILE_ITEMS // 2 - 1, TILE_ITEMS // 2, 3 * TILE_ITEMS // 2}
    seen[4] |= set(np.argsort(-scores[4], kind="stable")[: 3 * k].tolist())
    seen[5] = set(range(n_items - 3))  # 3 eligible, fewer than k when k = 20
    seen[6] = set(range(n_items))  # nothing left: all -1, even with padding items around
    seen[7] = set(range(n_items)) - {n_items - 1}  # only the last real item, next to padding
    seen[260] = set(range(0, n_items, 2))  # half the catalogue, in the second chunk
    expected_values, expected_items = brute_force(scores, seen, k)
    for tiles in engines(items, bias):
        values, ranked = run(tiles, users, seen, k)
        np.testing.assert_array_equal(ranked, expected_items)
        np.testing.assert_array_equal(values, expected_values)
    assert np.all(ranked[6] == -1) and np.all(np.isneginf(values[6]))
    assert ranked[7][0] == n_items - 1 and np.all(ranked[7][1:] == -1)


def test_all_scores_equal_ranks_by_item() -> None:
    """Every score tied: the answer is the k lowest unseen items, through every tile."""
    n_items, k = GROUPED_MIN_ITEMS + 5, 20
    users = torch.ones(40, 4)
    items = torch.zeros(n_items, 4)
    seen = [set(range(u)) for u in range(40)]
    for tiles in engines(items, None):
        values, ranked = run(tiles, users, seen, k)
        for u in range(40):
            assert ranked[u].tolist() == list(range(u, u + k))
        assert np.all(values == 0)


def test_real_valued_scores_match_brute_force_on_the_same_gemm() -> None:
    """Gaussian factors: compared with brute force over the scores of the GEMM the tiles use
    (ranks are exact for those scores; another GEMM's rounding could swap near-ties)."""
    rng = np.random.default_rng(5)
    n_users, n_items, dims, k = 260, GROUPED_MIN_ITEMS + 100, 16, 20
    users = torch.from_numpy(rng.standard_normal((n_users, dims), dtype=np.float32))
    items = torch.from_numpy(rng.standard_normal((n_items, dims), dtype=np.float32))
    bias = torch.from_numpy(rng.standard_normal(n_items, dtype=np.float32))
    seen = [set(rng.integers(0, n_items, 30).tolist()) for _ in range(n_users)]
    augmented = torch.cat([users, torch.ones(n_users, 1)], dim=1)
    for tiles in engines(items, bias):
        scores = gemm_scores(tiles, augmented)
        values, ranked = run(tiles, users, seen, k)
        expected_values, expected_items = brute_force(scores, seen, k)
        np.testing.assert_array_equal(ranked, expected_items)
        np.testing.assert_array_equal(values, expected_values)


def test_no_users_and_users_without_history() -> None:
    rng = np.random.default_rng(1)
    users, items, bias, scores = integer_problem(rng, 10, GROUPED_MIN_ITEMS, 4, True)
    tiles = ItemTiles.build(items, bias)
    values, ranked = tiles.top_k(users[:0], np.zeros(0, np.int64), np.zeros(0, np.int64), 5)
    assert values.shape == (0, 5) and ranked.shape == (0, 5)
    values, ranked = run(tiles, users, [set() for _ in range(10)], 5)
    expected_values, expected_items = brute_force(scores, [set() for _ in range(10)], 5)
    np.testing.assert_array_equal(ranked, expected_items)
    np.testing.assert_array_equal(values, expected_values)


def test_every_shape_scores_bit_for_bit_like_the_fixed_one() -> None:
    """On this process's engine the tile shape never changes a score, so a change of the
    fixed shape changes no ranking of near-ties."""
    rng = np.random.default_rng(7)
    users = torch.from_numpy(rng.standard_normal((520, 33), dtype=np.float32))
    items = torch.from_numpy(rng.standard_normal((GROUPED_MIN_ITEMS + 100, 32), dtype=np.float32))
    bias = torch.from_numpy(rng.standard_normal(len(items), dtype=np.float32))
    users[:, -1] = 1
    default, *others = (ItemTiles.build(items, bias, k) for k in shapes())
    expected = gemm_scores(default, users)
    for tiles in others:
        np.testing.assert_array_equal(gemm_scores(tiles, users), expected)


def test_tiles_hold_items_by_descending_norm_and_answers_do_not_depend_on_it() -> None:
    """The first tile holds the items of highest norm of (factors, bias), equal norms in id
    order; the same catalogue given in reverse order ranks alike once ids are mapped back,
    and both equal brute force (integer factors: many tied scores and tied norms)."""
    rng = np.random.default_rng(11)
    n_users, n_items, dims, k = 270, GROUPED_MIN_ITEMS + 300, 4, 20
    users, items, bias, scores = integer_problem(rng, n_users, n_items, dims, True)
    tiles = ItemTiles.build(items, bias)
    norms = (items**2).sum(1).numpy() + bias.numpy() ** 2
    real = tiles.ids[:n_items]
    assert np.all(np.diff(norms[real]) <= 0)
    tied = np.diff(norms[real]) == 0
    assert tied.any() and np.all(np.diff(real)[tied] > 0)
    assert sorted(real.tolist()) == list(range(n_items))
    seen = [set(rng.integers(0, n_items, rng.integers(0, 30)).tolist()) for _ in range(n_users)]
    expected_values, expected_items = brute_force(scores, seen, k)
    values, ranked = run(tiles, users, seen, k)
    np.testing.assert_array_equal(ranked, expected_items)
    np.testing.assert_array_equal(values, expected_values)
    flip = n_items - 1 - np.arange(n_items)  # item i of the reversed catalogue is item flip[i]
    reversed_tiles = ItemTiles.build(items[flip], bias[flip])
    values_r, ranked_r = run(reversed_tiles, users, [{int(flip[i]) for i in s} for s in seen], k)
    # Same scores; among tied scores each catalogue ranks its own lowest id first.
    np.testing.assert_array_equal(values_r, expected_values)
    mapped = np.where(ranked_r >= 0, flip[ranked_r], -1)
    for user in range(n_users):
        for value in np.unique(expected_values[user][np.isfinite(expected_values[user])]):
            at = expected_values[user] == value
            tie = set(np.flatnonzero(scores[user] == value)) - seen[user]
            assert set(mapped[user][at]) <= tie and set(expected_items[user][at]) <= tie


def test_k_above_the_number_of_items_ranks_every_eligible_item_then_pads() -> None:
    """More recommendations asked than items exist: every unseen item in brute-force order,
    then -1 with -inf, also where the catalogue is smaller than one tile."""
    rng = np.random.default_rng(13)
    n_users, n_items, dims, k = 40, 90, 3, 120
    users, items, bias, scores = integer_problem(rng, n_users, n_items, dims, True)
    seen = [set(rng.integers(0, n_items, rng.integers(0, 20)).tolist()) for _ in range(n_users)]
    seen[0] = set(range(n_items))
    expected_values, expected_items = brute_force(scores, seen, k)
    for tiles in engines(items, bias):
        values, ranked = run(tiles, users, seen, k)
        np.testing.assert_array_equal(ranked, expected_items)
        np.testing.assert_array_equal(values, expected_values)
        assert np.all(ranked[:, n_items:] == -1) and np.all(np.isneginf(values[:, n_items:]))
        assert np.all(ranked[0] == -1)


def test_selection_compiles_where_numba_can_write_no_cache() -> None:
    """With no cache folder numba refuses ``cache=True`` at import; the selection then compiles
    uncached and still ranks like brute force (a fresh interpreter, so the import is real)."""
    script = textwrap.dedent(
        """
        import numba.core.caching as caching
        caching.CacheImpl._locator_classes = []  # as if no folder were writable
        import numpy as np, torch
        from inference.recs import topk_select
        from inference.recs.topk import GROUPED_MIN_ITEMS, ItemTiles
        assert topk_select.select_tile._cache.__class__.__name__ == "NullCache"
        rng = np.random.default_rng(2)
        users = torch.from_numpy(rng.integers(-2, 3, (30, 3)).astype(np.float32))
        items = torch.from_numpy(rng.integers(-2, 3, (GROUPED_MIN_ITEMS, 3)).astype(np.float32))
        none = np.zeros(0, np.int64)
        values, ranked = ItemTiles.build(items, None).top_k(users, none, none, 5)
        scores = (users @ items.T).numpy()
        order = np.argsort(-scores, axis=1, kind="stable")[:, :5]
        assert np.array_equal(ranked.numpy(), order), "ranks differ from brute force"
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
