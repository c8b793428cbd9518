"""Workload 2: exact top-K recommendations against faiss and against the bare GEMM."""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.common import Workload, best_alternated, best_of, timed
from inference.recs.sparse import SparseRows
from inference.recs.topk import ItemTiles, grouped_fits
from inference.recs.topk_blocks import block_size_for, masked_top_k, top_k
from inference.recs.topk_kernels import default_kernel


def make_problem(users: int, items: int, dims: int, k: int, seed: int = 0):
    """Random factors, a bias, and 0..60 seen items per user, a third of them from the
    user's true top-k so exclusion really changes the answer."""
    rng = np.random.default_rng(seed)
    u = torch.from_numpy(rng.standard_normal((users, dims), dtype=np.float32))
    v = torch.from_numpy(rng.standard_normal((items, dims), dtype=np.float32))
    bias = torch.from_numpy(rng.standard_normal(items, dtype=np.float32) * 0.5)
    counts = rng.integers(0, 61, users)
    rows = np.repeat(np.arange(users), counts)
    cols = rng.integers(0, items, len(rows))
    top = torch.topk(u[:2000] @ v.T + bias, k, dim=1).indices.numpy()
    favourite = rows < 2000
    pick = favourite & (rng.random(len(rows)) < 0.33)
    cols[pick] = top[rows[pick], rng.integers(0, k, int(pick.sum()))]
    return u, v, bias, SparseRows.from_pairs(rows, cols, users)


def faiss_search(u: np.ndarray, v: np.ndarray, bias: np.ndarray, k: int):
    """faiss IndexFlatIP over the same scores: the bias rides along as one more dimension."""
    import faiss

    index = faiss.IndexFlatIP(v.shape[1] + 1)
    index.add(np.hstack([v, bias[:, None]]).astype(np.float32))
    queries = np.hstack([u, np.ones((len(u), 1), np.float32)])
    return index, queries


def faiss_excluding(index, queries: np.ndarray, seen: SparseRows, k: int) -> np.ndarray:
    """faiss with exact exclusion: ask for k + (seen items) results, then drop the seen ones.

    Users are grouped by seen count rounded up to a power of two, so each group over-fetches
    once; the filtering is vectorised, to be fair to the peer.
    """
    lengths = seen.row_lengths()
    buckets = 2 ** np.ceil(np.log2(np.maximum(lengths, 16))).astype(np.int64)
    out = np.full((len(queries), k), -1, dtype=np.int64)
    width = index.ntotal + 1
    for extra in np.unique(buckets):
        group = np.flatnonzero(buckets == extra)
        _, ids = index.search(queries[group], k + int(extra))
        local, cols, _ = seen.take(group)
        banned = np.isin(np.arange(len(group))[:, None] * width + ids, local * width + cols)
        keep = (ids >= 0) & ~banned
        order = np.argsort(~keep, axis=1, kind="stable")[:, :k]
        chosen = np.take_along_axis(ids, order, 1)
        out[group] = np.where(np.take_along_axis(keep, order, 1), chosen, -1)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(
    users: int, items: int, dims: int, k: int, max_batch_size: int, device: str = "cpu"
) -> Workload:
    w = Workload("2 recommendations top-K")
    u, v, bias, seen = make_problem(users, items, dims, k)
    dev = torch.device(device)
    u_cpu, v_cpu, bias_cpu = u, v, bias
    u, v, bias = u.to(dev), v.to(dev), bias.to(dev)
    block = block_size_for(items, max_batch_size)
    w.facts.update(
        users=users, items=items, dims=dims, k=k, block_size=block, seen_items=int(seen.indptr[-1])
    )

    # The first call in a process also builds oneDNN's kernels for the tile shape and loads (or
    # compiles) the selection; the figures below are of later calls, and the first call is a
    # row of its own.
    _, first = timed(lambda: top_k(u, v, bias, seen, k, block))
    tiled = grouped_fits(v, k)
    if tiled:
        kernel = default_kernel()
        w.facts["topk_kernel"] = f"{kernel.engine} {kernel.chunk_users}x{kernel.tile_items}"

    def ours_call():
        return top_k(u, v, bias, seen, k, block)

    try:
        import faiss  # noqa: F401
    except ImportError:
        index = None
        w.facts["faiss"] = "not installed: pip install -e '.[bench]'"
    else:
        index, queries = faiss_search(u_cpu.numpy(), v_cpu.numpy(), bias_cpu.numpy(), k)
        w.facts["faiss_device"] = "cpu"
    # nightshift and faiss take turns, so that the ratio the target judges sees one minute's
    # machine; the other peers are timed after, each on its own.
    calls = {"ours": ours_call}
    if index is not None:
        calls["faiss"] = lambda: index.search(queries, k)
    best = best_alternated(calls, 3)
    (scores, ours_items), ours = best["ours"]

    def full_rows() -> None:
        items_t = v.T.contiguous()
        for start in range(0, users, block):
            s = u[start : start + block] @ items_t + bias
            r, c, _ = seen.take(np.arange(start, min(start + block, users)))
            masked_top_k(s, torch.from_numpy(r).to(dev), torch.from_numpy(c).to(dev), k)
        _sync(dev)

    _, before = best_of(full_rows, 1)

    def gemm() -> None:
        buffer = torch.empty(256, items, device=dev)
        items_t = v.T.contiguous()
        for start in range(0, users, 256):
            n = min(256, users - start)
            torch.addmm(bias, u[start : start + n], items_t, out=buffer[:n])
        _sync(dev)

    def tiled_gemm() -> None:
        """The same scores by the GEMM nightshift's CPU top-K runs (oneDNN where torch has
        it), tile by tile, with no selection at all."""
        tiles = ItemTiles.build(v_cpu, bias_cpu)
        augmented = torch.cat([u_cpu, torch.ones(users, 1)], dim=1)
        step, gemm = tiles.kernel.chunk_users, tiles.kernel.gemm
        for start in range(0, users, step):
            chunk = augmented[start : start + step]
            for tile in tiles.tiles:
                gemm(chunk, tile)

    _, torch_gemm = best_of(gemm, 2)
    w.facts["torch_addmm_gemm_s"] = round(torch_gemm, 3)
    # On the CPU torch's addmm is no floor: nightshift's tiles run their own GEMM engine.
    floor = torch_gemm
    if tiled:
        _, floor = best_of(tiled_gemm, 2)
    w.compare(
        "nightshift top_k (seen excluded)",
        "pure GEMM of the same scores",
        ours,
        floor,
        "s",
        False,
        None,
        "the GEMM is the floor: the ratio is the selection's cost",
    )

    if index is None:
        return w
    _, plain = best["faiss"]
    excluded, exact = best_of(lambda: faiss_excluding(index, queries, seen, k), 1)
    w.compare(
        "nightshift top_k (seen excluded)",
        "faiss IndexFlatIP (no exclusion)",
        ours,
        plain,
        "s",
        False,
        1.0,
    )
    if tiled:
        w.compare(
            "nightshift top_k, first call",
            "faiss IndexFlatIP (no exclusion)",
            first,
            plain,
            "s",
            False,
            None,
            f"chose {w.facts['topk_kernel']}",
        )
    w.compare(
        "nightshift top_k (seen excluded)",
        "faiss IndexFlatIP + over-fetch (exact exclusion)",
        ours,
        exact,
        "s",
        False,
        None,
    )
    w.compare(
        "nightshift top_k (seen excluded)",
        "previous nightshift: topk over whole rows",
        ours,
        before,
        "s",
        False,
        None,
    )
    w.facts["faiss_excluding_matches_nightshift"] = float(np.mean(excluded == ours_items))
    return w
