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

from benchmarks.common import Workload
from benchmarks.executor import DAY, score
from benchmarks.fraud_data import landed_day
from benchmarks.on_off import alternate, compare
from inference.engine.backstop import Backstop
from inference.engine.watchdog import Heartbeat

BEATS = 200_000

WATCHDOG = {"on": None, "off": 0.0}  # stall_seconds: derived limits, or off


def run(
    work: Path, rows: int, threads: int, batch_size: int, shard_rows: int, repeats: int = 3
) -> Workload:
    w = Workload("12 watchdog")
    root = work / "watchdog"
    rows = landed_day(root, DAY, rows, threads)

    def day(setting: str) -> tuple[float, dict]:
        stall = {"stall_seconds": WATCHDOG[setting]}
        return score(root, "local", threads, batch_size, shard_rows, **stall)

    ran = alternate(day, root, repeats)
    w.facts.update(
        rows=rows,
        shard_rows=shard_rows,
        threads=threads,
        batch_size=batch_size,
        repeats=repeats,
        **ran.facts(),
    )
    compare(
        w,
        ran,
        rows,
        "fraud_scores, watchdog on (default limits)",
        "the same, watchdog off (stall_seconds=0)",
        repeats,
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
