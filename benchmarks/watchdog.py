"""Workload 12: what the progress watchdog costs a fraud day when nothing stalls.

The same landed day is scored through ``materialize`` of ``fraud_scores`` with the watchdog on
(the default limits: model calls on a scoring thread, a heartbeat per call) and off
(``stall_seconds=0``: model calls on the step's own thread, nothing watched), alternating in
one process, best of N each. The outputs must be equal. "On" includes the backstop process
(inference/engine/backstop.py): started with the day, its heartbeat mirror written at every
beat, its pulse thread. Its own costs are measured apart too: a heartbeat beat with the mirror
against one without, and the backstop's start and close.
"""

from __future__ import annotations

import time
from pathlib import Path

from dagster import DagsterInstance, materialize

from assets.fraud.assets import transactions
from benchmarks.common import QUIET_RUN_CONFIG, Workload
from benchmarks.executor import DAY, outputs, same, score
from benchmarks.fraud_data import train_model, write_partition
from inference.engine.backstop import Backstop
from inference.engine.watchdog import Heartbeat
from resources.storage import StorageResource

BEATS = 200_000

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
    _backstop_costs(w, repeats)
    return w


def _beats(heartbeat: Heartbeat) -> float:
    """Beats per second of one shard's model calls on ``heartbeat``."""
    heartbeat.shard_started(0)
    began = time.perf_counter()
    for batch in range(1, BEATS + 1):
        heartbeat.beat(0, batch, 0.01)
    return BEATS / (time.perf_counter() - began)


def _backstop_costs(w: Workload, repeats: int) -> None:
    """A beat with the backstop's mirror against one without, best of ``repeats`` alternated,
    and the backstop's start and close, each timed."""
    backstop = Backstop()
    try:
        mirrored, plain = Heartbeat(), Heartbeat()
        mirrored.mirror = backstop.beat
        rates: dict[str, list[float]] = {"mirror": [], "plain": []}
        for _ in range(repeats):
            rates["mirror"].append(_beats(mirrored))
            rates["plain"].append(_beats(plain))
    finally:
        backstop.close()
    start_close = []
    for _ in range(repeats):
        began = time.perf_counter()
        Backstop().close()
        start_close.append(time.perf_counter() - began)
    w.facts.update(
        beats=BEATS,
        beats_per_s={k: [round(r) for r in v] for k, v in rates.items()},
        backstop_start_close_s=[round(s, 3) for s in start_close],
    )
    w.compare(
        "heartbeat beat with the backstop's mirror",
        "the same beat without it",
        max(rates["mirror"]),
        max(rates["plain"]),
        "beats/s",
        True,
        None,
        f"{BEATS} beats, best of {repeats} alternated in one process",
    )
