"""The per-tile selection of the CPU top-K (``inference.recs.topk``), compiled by numba.

Each user keeps a binary heap of its ``k`` best (score, item) so far, worst at the root; a
tile's group maxima say which groups can hold a better item, and only those groups' items are
compared. "Better" is the brute-force order: higher score, then lower item id, so the heaps
hold the exact top ``k`` after the last tile whatever order the tiles came in. numpy cannot
express the compare-and-insert without materialising every kept candidate and sorting them,
which cost more than the tile's GEMM leaves room for; compiled, it reads each kept group once.

Compiled on first use in a process and cached beside this file (numba's ``cache=True``), so a
later process, a Ray actor or a resumed run loads it instead of compiling it again. Where no
cache folder is writable (an installed package on a read-only image, no writable home),
numba refuses ``cache=True`` outright; then each process compiles its own copy.
"""

from __future__ import annotations

import numba
import numpy as np


def _compiled(function):
    """``function`` compiled without the GIL, cached where numba can write a cache."""
    try:
        return numba.njit(cache=True, nogil=True, boundscheck=False)(function)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(nogil=True, boundscheck=False)(function)


# An empty heap slot: -inf loses to every eligible item, and the largest id loses every tie.
EMPTY_ID = np.iinfo(np.int64).max


def empty_heaps(users: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, items) heaps of ``users`` rows of ``k`` empty slots."""
    return np.full((users, k), -np.inf, np.float32), np.full((users, k), EMPTY_ID, np.int64)


@_compiled
def _sift_down(scores, items, at, size):  # pragma: no cover - compiled
    """Restore the heap below ``at`` in the first ``size`` slots (worst at the root)."""
    score, item = scores[at], items[at]
    while True:
        child = 2 * at + 1
        if child >= size:
            break
        right = child + 1
        if right < size and (
            scores[right] < scores[child]
            or (scores[right] == scores[child] and items[right] > items[child])
        ):
            child = right
        if scores[child] < score or (scores[child] == score and items[child] > item):
            scores[at], items[at] = scores[child], items[child]
            at = child
        else:
            break
    scores[at], items[at] = score, item


@_compiled
def select_tile(scores, maxima, tile_items, floors, heap_scores, heap_items):  # pragma: no cover
    """Offer each user the items of its tile's groups that can still enter its top k.

    Args:
        scores: (users, tile) float32 scores of one tile, seen items already -inf.
        maxima: (users, groups) float32 maximum of each group; group ``g`` holds tile
            positions ``g, g + groups, g + 2 * groups, ...``. A NaN maximum drops its group.
        tile_items: (tile,) int64 item id at each tile position.
        floors: (users,) float32 scores below which no item can be in the user's top k
            (-inf where nothing is known).
        heap_scores, heap_items: (users, k) heaps, updated in place.
    """
    users, size = scores.shape
    groups = maxima.shape[1]
    members = size // groups
    k = heap_scores.shape[1]
    for user in range(users):
        row, group_max, floor = scores[user], maxima[user], floors[user]
        kept, ids = heap_scores[user], heap_items[user]
        # An item enters only if it beats the root and reaches the floor, so a group below
        # either holds none.
        bar = max(kept[0], floor)
        for group in range(groups):
            if not group_max[group] >= bar:
                continue
            for member in range(members):
                at = group + member * groups
                score = row[at]
                if score < floor:
                    continue
                # -inf is a seen or padding item: never eligible, even into an empty slot.
                worst = kept[0]
                if score > worst or (
                    score == worst and score > -np.inf and tile_items[at] < ids[0]
                ):
                    kept[0], ids[0] = score, tile_items[at]
                    _sift_down(kept, ids, 0, k)
                    bar = max(kept[0], floor)


@_compiled
def ranked(heap_scores, heap_items, out_scores, out_items):  # pragma: no cover - compiled
    """Each heap in brute-force order into ``out_*`` (-inf and -1 in empty slots); the heaps
    are consumed."""
    users, k = heap_scores.shape
    for user in range(users):
        kept, ids = heap_scores[user], heap_items[user]
        for size in range(k, 0, -1):
            score = kept[0]
            out_scores[user, size - 1] = score
            out_items[user, size - 1] = ids[0] if score > -np.inf else -1
            kept[0], ids[0] = kept[size - 1], ids[size - 1]
            _sift_down(kept, ids, 0, size - 1)
