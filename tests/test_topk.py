"""The cache-tiled grouped top-K (inference/recs/topk.py) against brute force, on edge cases,
for every candidate kernel, and the timed choice between the kernels.

Factors are small integers, so every score is exact in fp32 whatever the GEMM's summation
order: ties are common and must come out as brute force ranks them (lowest item first).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inference.recs import topk, topk_kernels
from inference.recs.topk import GROUPED_MIN_ITEMS, ItemTiles, fastest
from inference.recs.topk_kernels import GROUP_ITEMS, MAX_TILE_ITEMS, Kernel, candidates

TILE_ITEMS = MAX_TILE_ITEMS


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


def engines(items: torch.Tensor, bias: torch.Tensor | None) -> list[ItemTiles]:
    """The tiles for every candidate shape (oneDNN where torch has it), the one this process
    chose, and numpy's BLAS engine at the default shape."""
    chosen = ItemTiles.build(items, bias)
    kernels = [*candidates(), Kernel("blas", *topk_kernels.SHAPES[0])]
    return [chosen, *(ItemTiles.build(items, bias, k) for k in kernels if k != chosen.kernel)]


def gemm_scores(tiles: ItemTiles, augmented: torch.Tensor) -> np.ndarray:
    """All scores, chunk by chunk and tile by tile, as the tiles' GEMM computes them."""
    step, gemm = tiles.kernel.chunk_users, tiles.kernel.gemm
    chunks = [augmented[s : s + step] for s in range(0, len(augmented), step)]
    return np.concatenate(
        [np.concatenate([gemm(c, t) for t in tiles.tiles], axis=1) for c in chunks]
    )


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
        scores = gemm_scores(tiles, augmented)[:, :n_items]
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


def test_every_candidate_shape_scores_bit_for_bit_like_the_default() -> None:
    """The premise of timing shapes: on this process's engine the tile shape never changes a
    score, so whichever shape wins, every process ranks near-ties alike."""
    rng = np.random.default_rng(7)
    users = torch.from_numpy(rng.standard_normal((520, 33), dtype=np.float32))
    items = torch.from_numpy(rng.standard_normal((GROUPED_MIN_ITEMS + 100, 32), dtype=np.float32))
    bias = torch.from_numpy(rng.standard_normal(len(items), dtype=np.float32))
    users[:, -1] = 1
    default, *others = (ItemTiles.build(items, bias, k) for k in candidates())
    expected = gemm_scores(default, users)[:, : len(items)]
    for tiles in others:
        np.testing.assert_array_equal(gemm_scores(tiles, users)[:, : len(items)], expected)


def test_fastest_times_only_candidates_that_agree_and_keeps_the_quickest() -> None:
    """A fake clock charges each candidate its own cost: the cheapest candidate whose answer
    equals the default's wins; a cheaper one that answers differently is never chosen."""
    rng = np.random.default_rng(2)
    users, items, bias, _ = integer_problem(rng, 64, GROUPED_MIN_ITEMS, 4, True)
    kernels = candidates()
    built = [ItemTiles.build(items, bias, k) for k in kernels]
    wrong = ItemTiles.build(-items, bias, kernels[-1])  # other scores, so another answer
    cost = {id(t): 5.0 - i for i, t in enumerate(built)} | {id(wrong): 0.1}
    now = [0.0]
    calls: list[int] = []

    def run_probe(tiles: ItemTiles):
        calls.append(id(tiles))
        now[0] += cost[id(tiles)]
        return tiles.top_k(users, np.zeros(0, np.int64), np.zeros(0, np.int64), 5)

    chosen = fastest([*built, wrong], run_probe, rounds=3, clock=lambda: now[0])
    assert chosen == kernels[-1]
    assert calls.count(id(wrong)) == 1  # the agreement check only, never timed
    assert all(calls.count(id(t)) == 4 for t in built[1:])  # check + 3 timed rounds


def test_fastest_kernel_is_measured_once_per_width_and_is_a_candidate() -> None:
    before = topk._fastest_kernel.cache_info()
    first = topk.fastest_kernel(17)
    again = topk.fastest_kernel(17)
    after = topk._fastest_kernel.cache_info()
    assert first == again and first in candidates()
    assert after.hits >= before.hits + 1
    assert after.misses <= before.misses + 1
    assert ItemTiles.build(torch.zeros(GROUPED_MIN_ITEMS, 16), None).kernel == first
