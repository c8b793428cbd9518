"""Workload 2's CPU top-K of two trees, alternated in one process, with faiss beside them.

    git worktree add /tmp/old <commit>
    python -m benchmarks.topk_ab --old /tmp/old --rounds 6

Loads ``inference/recs/topk.py`` of the ``--old`` checkout under another module name (its
imports resolve to this tree's other modules), checks that both trees rank alike, then times
old, new and faiss in turn for ``--rounds`` rounds, by this process's CPU time. Prints one JSON
line: each one's best and median seconds, faiss's best over each tree's, and new over old
round by round (below 1: this tree is faster). Alternating in one process is what makes the
ratio stable where the machine's speed moves between runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import set_threads
from benchmarks.recs import faiss_search, make_problem
from inference.recs.topk import ItemTiles


def load_old(tree: Path):
    """The ``--old`` tree's topk module, registered so its dataclasses resolve."""
    spec = importlib.util.spec_from_file_location("old_topk", tree / "inference/recs/topk.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_topk"] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--old", type=Path, required=True, help="a checkout of the other tree")
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--dims", type=int, default=64)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    set_threads(1)
    u, v, bias, seen = make_problem(args.users, args.items, args.dims, args.k)
    rows, cols, _ = seen.take(np.arange(args.users))
    trees = {"old": load_old(args.old).ItemTiles.build(v, bias), "new": ItemTiles.build(v, bias)}
    answers = [t.top_k(u, rows, cols, args.k) for t in trees.values()]
    same = all(torch.equal(a, b) for a, b in zip(*answers, strict=True))
    index, queries = faiss_search(u.numpy(), v.numpy(), bias.numpy(), args.k)
    runs = {name: (lambda t=t: t.top_k(u, rows, cols, args.k)) for name, t in trees.items()}
    runs["faiss"] = lambda: index.search(queries, args.k)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            began = time.process_time()
            run()
            seconds[name].append(time.process_time() - began)
    best = {name: min(s) for name, s in seconds.items()}
    print(
        json.dumps(
            {
                "same_ranking": same,
                "torch_isa": torch.backends.cpu.get_cpu_capability(),
                "best_s": {name: round(s, 3) for name, s in best.items()},
                "median_s": {name: round(float(np.median(s)), 3) for name, s in seconds.items()},
                "faiss_over_old": round(best["faiss"] / best["old"], 3),
                "faiss_over_new": round(best["faiss"] / best["new"], 3),
                "new_over_old": [
                    round(n / o, 3) for n, o in zip(seconds["new"], seconds["old"], strict=True)
                ],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
