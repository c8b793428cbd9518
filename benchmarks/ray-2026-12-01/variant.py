"""Workload 9 (memory, rows and keys) alone at scale 5 and 50 with other shard or row-group sizes.

    PYTHONPATH=. .venv/bin/python benchmarks/ray-2026-12-01/variant.py OUT SHARD_ROWS [ROW_GROUP_ROWS]

writes OUT/results.json and OUT/results.md as benchmarks/bench.py does.
"""

import sys
import tempfile
import time
from pathlib import Path

from benchmarks import memory_keys
from benchmarks.bench import write_results
from benchmarks.common import environment, quiet_logs, set_threads

out, shard_rows = Path(sys.argv[1]), int(sys.argv[2])
groups = int(sys.argv[3]) if len(sys.argv) > 3 else None
threads = set_threads(1)
results = {
    "profile": f"full, memory_keys only, shard_rows {shard_rows}, row groups {groups or 'as generated'}",
    "environment": environment(threads),
    "workloads": [],
}
began = time.perf_counter()
with tempfile.TemporaryDirectory(prefix="nightshift-bench-") as tmp, quiet_logs():
    w = memory_keys.run(Path(tmp) / "memory_keys", 5.0, 10, threads, shard_rows, groups)
results["workloads"].append(
    {
        "name": w.name,
        "facts": w.facts,
        "comparisons": [c.as_dict() for c in w.comparisons],
        "seconds": round(time.perf_counter() - began, 1),
    }
)
print(write_results(results, began, out))
