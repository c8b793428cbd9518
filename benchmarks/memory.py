"""Workload 5: peak memory of fraud scoring as the partition grows, each run in a fresh process.

``python -m benchmarks.memory MODE ROOT DATE THREADS BATCH`` scores one partition and prints
one JSON line: rows, seconds, the peak RSS after imports (the baseline) and at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.common import Workload

REPO = Path(__file__).resolve().parents[1]


def probe(mode: str, root: Path, date: str, threads: int, batch_size: int) -> dict:
    """Runs one scoring in a child process and returns what it measured."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.memory",
        mode,
        str(root),
        date,
        str(threads),
        str(batch_size),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe {mode} {date} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(work: Path, rows: int, factor: int, threads: int, batch_size: int) -> Workload:
    from benchmarks.fraud_data import train_model, write_partition

    w = Workload("5 memory")
    root = work / "memory"
    train_model(root, threads)
    small, large = "2026-03-02", "2026-03-03"
    small_rows = write_partition(root, small, rows)
    large_rows = write_partition(root, large, rows, copies=factor)
    runs = {
        "nightshift small": probe("nightshift", root, small, threads, batch_size),
        "nightshift large": probe("nightshift", root, large, threads, batch_size),
        "pandas small": probe("pandas", root, small, threads, batch_size),
    }
    w.facts.update(small_rows=small_rows, large_rows=large_rows, runs=runs)
    ns, nl, ps = runs["nightshift small"], runs["nightshift large"], runs["pandas small"]
    w.compare(
        f"nightshift, {large_rows:,} rows",
        f"nightshift, {small_rows:,} rows (peak RSS)",
        nl["peak_mb"],
        ns["peak_mb"],
        "MiB",
        False,
        round(1 / 1.2, 3),
        "target: the large run's peak within 1.2x of the small run's (ratio >= 0.833)",
    )
    w.compare(
        f"nightshift, {large_rows:,} rows",
        f"nightshift, {small_rows:,} rows (RSS above baseline)",
        nl["peak_mb"] - nl["baseline_mb"],
        ns["peak_mb"] - ns["baseline_mb"],
        "MiB",
        False,
        None,
        "growth of the working set alone, imports excluded",
    )
    w.compare(
        f"nightshift, {small_rows:,} rows",
        f"hand-written pandas, {small_rows:,} rows (peak RSS)",
        ns["peak_mb"],
        ps["peak_mb"],
        "MiB",
        False,
        None,
    )
    return w


def _main(mode: str, root: str, date: str, threads: int, batch_size: int) -> None:
    import time

    from benchmarks.common import quiet_logs, set_threads
    from benchmarks.fraud import load_scorer, run_nightshift, run_pandas
    from inference.engine.metrics import peak_rss_mb

    set_threads(threads)
    scorer, version = load_scorer(Path(root))
    baseline = peak_rss_mb()
    began = time.perf_counter()
    with quiet_logs():
        if mode == "nightshift":
            run_nightshift(Path(root), date, threads, batch_size)
        else:
            run_pandas(Path(root), date, scorer, version, Path(root) / f"pandas-{date}.parquet")
    seconds = time.perf_counter() - began
    print(
        json.dumps(
            {
                "mode": mode,
                "date": date,
                "seconds": round(seconds, 2),
                "baseline_mb": round(baseline, 1),
                "peak_mb": round(peak_rss_mb(), 1),
            }
        )
    )


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
