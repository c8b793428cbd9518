"""Workload 2's exact top-K against faiss IndexFlatIP, alternated in one process.

Prints one JSON line: the ISA torch, oneDNN and faiss run at, the tile shape the first call
chose and what choosing cost, and faiss's time over nightshift's (above 1: nightshift is
faster), by wall time and by this process's CPU time, each the best of ``--rounds``. CPU time
is the steadier figure on a shared machine: it leaves out the time other processes hold the
cores. Run with the variables in benchmarks/topk-2026-12-01.md to emulate an AVX2-only CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from benchmarks.common import set_threads
from benchmarks.recs import faiss_search, make_problem
from inference.recs.topk import fastest_kernel
from inference.recs.topk_blocks import block_size_for, top_k


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
    wall, cpu = time.perf_counter(), time.process_time()
    kernel = fastest_kernel(args.dims + 1)
    probe = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
    index, queries = faiss_search(u.numpy(), v.numpy(), bias.numpy(), args.k)
    block = block_size_for(args.items, 4096)
    runs = {
        "faiss": lambda: index.search(queries, args.k),
        "nightshift": lambda: top_k(u, v, bias, seen, args.k, block),
    }
    best = {(name, clock): float("inf") for name in runs for clock in ("wall", "cpu")}
    for _ in range(args.rounds):
        for name, run in runs.items():
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            best[name, "cpu"] = min(best[name, "cpu"], time.process_time() - cpu)
            best[name, "wall"] = min(best[name, "wall"], time.perf_counter() - wall)
    result = {
        "torch_isa": torch.backends.cpu.get_cpu_capability(),
        "faiss_simd": faiss.SIMDConfig.get_level_name(),
        "kernel": f"{kernel.engine} {kernel.chunk_users}x{kernel.tile_items}",
        "probe": {key: round(value, 3) for key, value in probe.items()},
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
