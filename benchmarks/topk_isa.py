"""Workload 2's exact top-K against faiss IndexFlatIP, alternated in one process.

Prints one JSON line: the ISA torch and faiss run at, the tile shape, the first call's time
(it also builds oneDNN's kernels for the shape), and faiss's time over nightshift's (above 1:
nightshift is faster), by wall time and by this process's CPU time, each the best of
``--rounds``. CPU time is the steadier figure on a shared machine: it leaves out the time other
processes hold the cores. Run with the variables in docs/benchmarks.md, "Top-K with and without AVX-512", to emulate
an AVX2-only CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from benchmarks.common import set_threads
from benchmarks.recs import faiss_search, make_problem
from inference.recs.topk_blocks import block_size_for, top_k
from inference.recs.topk_kernels import default_kernel


def clocked(run) -> dict[str, float]:
    """Wall and CPU seconds of one ``run()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--dims", type=int, default=64)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    import faiss

    u, v, bias, seen = make_problem(args.users, args.items, args.dims, args.k)
    block = block_size_for(args.items, 4096)
    first = clocked(lambda: top_k(u, v, bias, seen, args.k, block))
    index, queries = faiss_search(u.numpy(), v.numpy(), bias.numpy(), args.k)
    runs = {
        "faiss": lambda: index.search(queries, args.k),
        "nightshift": lambda: top_k(u, v, bias, seen, args.k, block),
    }
    best = {(name, clock): float("inf") for name in runs for clock in ("wall", "cpu")}
    for _ in range(args.rounds):
        for name, run in runs.items():
            for clock, seconds in clocked(run).items():
                best[name, clock] = min(best[name, clock], seconds)
    kernel = default_kernel()
    result = {
        "torch_isa": torch.backends.cpu.get_cpu_capability(),
        "faiss_simd": faiss.SIMDConfig.get_level_name(),
        "kernel": f"{kernel.engine} {kernel.chunk_users}x{kernel.tile_items}",
        "first_call": {clock: round(s, 3) for clock, s in first.items()},
        "seconds": {f"{name} {clock}": round(s, 3) for (name, clock), s in best.items()},
        "faiss_over_nightshift": {
            clock: round(best["faiss", clock] / best["nightshift", clock], 3)
            for clock in ("wall", "cpu")
        },
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
