"""Workload 6: ten partitions as one single-run backfill against ten separate runs.

Both go through the real CLI (``dagster asset materialize``), each run a fresh process, as a
scheduler or a person launching runs would: the single run pays the process start, imports and
model load once; the separate runs pay them ten times.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

from benchmarks.common import Workload, timed

REPO = Path(__file__).resolve().parents[1]


def _materialize(root: Path, home: Path, partition_args: list[str], threads: int) -> None:
    env = {
        **os.environ,
        "NIGHTSHIFT_DATA_ROOT": str(root),
        "DAGSTER_HOME": str(home),
        "OMP_NUM_THREADS": str(threads),
        "NIGHTSHIFT_CPU_THREADS": str(threads),
    }
    dagster = Path(sys.executable).with_name("dagster")
    command = [
        str(dagster),
        "asset",
        "materialize",
        "-m",
        "orchestration.definitions",
        "--select",
        "fraud_scores",
        *partition_args,
    ]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")


def run(work: Path, partitions: int, rows: int, threads: int) -> Workload:
    from benchmarks.fraud_data import train_model, write_partition

    w = Workload("6 backfill")
    root, home = work / "backfill", work / "backfill_home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    train_model(root, threads)
    days = [(date(2026, 3, 1) + timedelta(days=i)).isoformat() for i in range(partitions)]
    for day in days:
        write_partition(root, day, rows)
    _, single = timed(
        lambda: _materialize(root, home, ["--partition-range", f"{days[0]}...{days[-1]}"], threads)
    )
    _, separate = timed(
        lambda: [_materialize(root, home, ["--partition", d], threads) for d in days]
    )
    w.facts.update(
        partitions=partitions,
        rows_per_partition=rows,
        single_run_seconds=round(single, 2),
        separate_runs_seconds=round(separate, 2),
    )
    w.compare(
        f"one single-run backfill of {partitions} partitions",
        f"{partitions} separate runs",
        single,
        separate,
        "s",
        False,
        3.0,
        "each run a `dagster asset materialize` process",
    )
    return w
