"""Workload 7: one day landed as many small files against the same day as one file.

Real landing zones often hold one file per upstream task. The day is scored by the fraud job's
assets (``transactions``, ``fraud_scores``, ``fraud_alerts``) through Dagster; the figures are
each step's own time, from its start and success events.
"""

from __future__ import annotations

from pathlib import Path

from dagster import DagsterEventType, DagsterInstance, materialize

from assets.fraud.assets import fraud_alerts, fraud_scores, transactions
from benchmarks.common import QUIET_RUN_CONFIG, Workload
from benchmarks.fraud_data import resources, split_partition, train_model, write_partition

ONE_FILE, MANY_FILES = "2026-03-01", "2026-03-02"


def step_seconds(root: Path, date: str, threads: int, batch_size: int) -> dict[str, float]:
    """Materialises the fraud job's assets for one day; returns each step's wall seconds."""
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [transactions, fraud_scores, fraud_alerts],
            partition_key=date,
            resources=resources(root, threads, batch_size),
            instance=instance,
            run_config=QUIET_RUN_CONFIG,
        )
        if not result.success:
            raise RuntimeError(f"the fraud job failed for {date}")
        started: dict[str, float] = {}
        seconds: dict[str, float] = {}
        for entry in instance.all_logs(result.run_id):
            event = entry.dagster_event
            if event is None:
                continue
            if event.event_type == DagsterEventType.STEP_START:
                started[event.step_key] = entry.timestamp
            elif event.event_type == DagsterEventType.STEP_SUCCESS:
                seconds[event.step_key] = entry.timestamp - started[event.step_key]
    return seconds


def run(
    work: Path, rows: int, files: int, threads: int, batch_size: int, repeats: int = 5
) -> Workload:
    w = Workload("7 small files")
    root = work / "small_files"
    train_model(root, threads)
    write_partition(root, ONE_FILE, rows)
    landed = write_partition(root, MANY_FILES, rows)
    written = split_partition(root, MANY_FILES, files)
    days = {ONE_FILE: 1, MANY_FILES: written}
    best: dict[str, dict[str, float]] = {ONE_FILE: {}, MANY_FILES: {}}
    for date in days:  # warm-up: imports, page cache
        step_seconds(root, date, threads, batch_size)
    for _ in range(repeats):  # alternated, so both see the same load; the fastest of each
        for date in days:
            for step, s in step_seconds(root, date, threads, batch_size).items():
                best[date][step] = min(best[date].get(step, s), s)
    one, many = best[ONE_FILE], best[MANY_FILES]
    w.facts.update(rows=landed, files=written, repeats=repeats, step_seconds=best)

    def both(steps: dict[str, float]) -> float:
        return steps["fraud_scores"] + steps["fraud_alerts"]

    w.compare(
        f"fraud_scores + fraud_alerts, {landed:,} rows as {written} files",
        "the same day as 1 file",
        both(many),
        both(one),
        "s",
        False,
        round(1 / 1.5, 3),
        f"target: {written} files cost at most 1.5x one file (ratio >= 0.667); fraud_scores "
        f"{many['fraud_scores']:.2f} vs {one['fraud_scores']:.2f} s, fraud_alerts "
        f"{many['fraud_alerts']:.2f} vs {one['fraud_alerts']:.2f} s",
    )
    w.compare(
        f"transactions (landing checks), {written} files",
        "the same day as 1 file",
        many["transactions"],
        one["transactions"],
        "s",
        False,
        None,
        "the step before: contract, screening and its checks read the same files",
    )
    return w
