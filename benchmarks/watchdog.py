"""Workload 12: what the progress watchdog costs a fraud day when nothing stalls.

The same landed day is scored through ``materialize`` of ``fraud_scores`` with the watchdog on
(the default limits: model calls on a scoring thread, a heartbeat per call) and off
(``stall_seconds=0``: model calls on the step's own thread, nothing watched), alternating in
one process, best of N each. The outputs must be equal.
"""

from __future__ import annotations

from pathlib import Path

from dagster import DagsterInstance, materialize

from assets.fraud.assets import transactions
from benchmarks.common import QUIET_RUN_CONFIG, Workload
from benchmarks.executor import DAY, outputs, same, score
from benchmarks.fraud_data import train_model, write_partition
from resources.storage import StorageResource

WATCHDOG = {"on": None, "off": 0.0}  # stall_seconds: derived limits, or off


def run(
    work: Path, rows: int, threads: int, batch_size: int, shard_rows: int, repeats: int = 3
) -> Workload:
    w = Workload("12 watchdog")
    root = work / "watchdog"
    train_model(root, threads)
    rows = write_partition(root, DAY, rows)
    with DagsterInstance.ephemeral() as instance:  # the day's landing checks and saved screen
        if not materialize(
            [transactions],
            partition_key=DAY,
            resources={"storage": StorageResource(data_root=str(root))},
            instance=instance,
            run_config=QUIET_RUN_CONFIG,
        ).success:
            raise RuntimeError(f"the landing checks failed for {DAY}")

    def day(setting: str) -> tuple[float, dict]:
        stall = {"stall_seconds": WATCHDOG[setting]}
        return score(root, "local", threads, batch_size, shard_rows, **stall)

    day("off")  # warm-up (imports, page cache); its output is the one compared
    off_out = outputs(root)
    day("on")
    equal = same(off_out, outputs(root))
    runs: dict[str, list[float]] = {"on": [], "off": []}
    engine: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(repeats):  # alternated, so both see the same load
        for setting in ("on", "off"):
            seconds, meta = day(setting)
            runs[setting].append(seconds)
            engine[setting].append(meta["seconds"])
    equal = equal and same(off_out, outputs(root))
    on, off = min(runs["on"]), min(runs["off"])
    w.facts.update(
        rows=rows,
        shard_rows=shard_rows,
        threads=threads,
        batch_size=batch_size,
        repeats=repeats,
        seconds={k: [round(s, 3) for s in v] for k, v in runs.items()},
        engine_seconds={k: [round(s, 3) for s in v] for k, v in engine.items()},
        outputs_equal=equal,
    )
    if not equal:
        raise RuntimeError("the day scored with the watchdog on differs from the day without")
    w.compare(
        "fraud_scores, watchdog on (default limits)",
        "the same, watchdog off (stall_seconds=0)",
        rows / on,
        rows / off,
        "rows/s",
        True,
        None,
        f"best of {repeats} alternated in one process; outputs equal: {equal}",
    )
    return w
