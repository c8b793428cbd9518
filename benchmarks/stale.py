"""Listing the stale days of 1,000 daily partitions: the two-query read against the peers.

A SQLite instance on disk (the laptop default) holds one scored asset with ``--partitions``
days, each materialised with a scored day's metadata laid out as the runner lays it out
(headline plus a detail table of ``--figures`` figures): ``--history`` times by the old version
(re-runs, earlier re-scores), and the newest ``--rescored`` days once more by the champion.
Three ways to list the days not scored by the champion, each timed as the best of
``--repeats`` rounds in which the three take turns, all required to give the same list:

- nightshift (``assets.staleness.scored_days`` + ``stale_days``): the latest storage id of each
  partition in one query, then those records in one more per 900 days;
- one query per partition (what the runner does for one day, ``latest_materialization``),
  1,000 times;
- every materialisation of the asset, newest first, paged (the public scan without a
  per-partition index): it reads each day's whole history.

Usage:
``python -m benchmarks.stale --partitions 1000 --history 1 3 --out DIR``; its results.md is
kept as benchmarks/stale-results.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from dagster import AssetKey, AssetMaterialization, AssetRecordsFilter, DagsterInstance

from assets.day_metadata import day_figures, day_metadata
from assets.staleness import ScoredDay, scored_days, stale_days, window
from benchmarks.common import Comparison, environment, timed

ASSET = "scored_asset"
OLD, CHAMPION = "0123456789abcdef", "fedcba9876543210"


def populate(
    instance: DagsterInstance, dates: list[str], history: int, rescored: int, figures: int
) -> None:
    """Every day scored ``history`` times by the old version (re-runs, earlier re-scores); the
    newest ``rescored`` days once more by the champion."""

    def record(date: str, version: str) -> None:
        detail = {f"figure_{n}": float(n) for n in range(figures)}
        metadata = day_metadata(
            {"dagster/row_count": 100_000, "model_version": version, "seconds": 1.5, **detail}
        )
        event = AssetMaterialization(ASSET, partition=date, metadata=metadata)
        instance.report_runless_asset_event(event)

    for _ in range(history):
        for date in dates:
            record(date, OLD)
    for date in dates[len(dates) - rescored :]:
        record(date, CHAMPION)


def by_storage_ids(instance: DagsterInstance) -> list[str]:
    return [d.date for d in stale_days(scored_days(instance, ASSET), CHAMPION)]


def one_query_per_day(instance: DagsterInstance, dates: list[str]) -> list[str]:
    scored: dict[str, ScoredDay] = {}
    for date in dates:
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(ASSET), asset_partitions=[date]), limit=1
        ).records
        if records:
            version = day_figures(records[0].asset_materialization.metadata)["model_version"]
            scored[date] = ScoredDay(date, version, records[0].run_id, records[0].timestamp)
    return [d.date for d in stale_days(scored, CHAMPION)]


def full_scan(instance: DagsterInstance, page: int = 1_000) -> list[str]:
    scored: dict[str, ScoredDay] = {}
    cursor = None
    while True:
        result = instance.fetch_materializations(AssetKey(ASSET), limit=page, cursor=cursor)
        for record in result.records:
            event = record.asset_materialization
            if event.partition not in scored:  # newest first: the first seen is the latest
                version = day_figures(event.metadata)["model_version"]
                scored[event.partition] = ScoredDay(
                    event.partition, version, record.run_id, record.timestamp
                )
        if not result.has_more:
            break
        cursor = result.cursor
    return [d.date for d in stale_days(scored, CHAMPION)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", type=int, default=1_000)
    parser.add_argument(
        "--history", type=int, nargs="+", default=[1, 3], help="records of each day before"
    )
    parser.add_argument("--rescored", type=int, default=300)
    parser.add_argument("--figures", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="folder for results.json and results.md")
    args = parser.parse_args()
    facts = environment(threads=1)
    comparisons = [c for history in args.history for c in measure(args, history)]
    report(args, facts, comparisons)


def measure(args: argparse.Namespace, history: int) -> list[Comparison]:
    """The three listings over one instance whose days each hold ``history`` older records."""
    dates = window("2026-11-30", args.partitions)
    with tempfile.TemporaryDirectory() as home, DagsterInstance.local_temp(home) as instance:
        populate(instance, dates, history, args.rescored, args.figures)
        ways = {
            "subject": lambda: by_storage_ids(instance),
            "per_day": lambda: one_query_per_day(instance, dates),
            "scan": lambda: full_scan(instance),
        }
        listed, best = interleaved(ways, args.repeats)
    subject, per_day, scan = listed["subject"], listed["per_day"], listed["scan"]
    subject_s, per_day_s, scan_s = best["subject"], best["per_day"], best["scan"]
    if not subject == per_day == scan or len(subject) != args.partitions - args.rescored:
        raise RuntimeError("the three listings disagree: the benchmark measures nothing")
    shape = (
        f"{args.partitions:,} days x {history} older record(s), {args.rescored:,} re-scored, "
        f"{len(subject):,} stale"
    )
    compare = [("one query per day", per_day_s), ("paged scan of every materialisation", scan_s)]
    return [
        Comparison("stale days", "two queries", peer, subject_s, seconds, "s", False, note=shape)
        for peer, seconds in compare
    ]


def interleaved(
    ways: dict[str, Callable[[], list[str]]], repeats: int
) -> tuple[dict[str, list[str]], dict[str, float]]:
    """Each way's listing and its fastest time, the ways taking turns in every round: on a
    shared machine the load then changes under all of them alike."""
    listed: dict[str, list[str]] = {}
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(max(1, repeats)):
        for name, way in ways.items():
            listed[name], seconds = timed(way)
            best[name] = min(best[name], seconds)
    return listed, best


def report(args: argparse.Namespace, facts: dict, comparisons: list[Comparison]) -> None:
    rows = [c.as_dict() for c in comparisons]
    body = {
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python -m benchmarks.stale "
        f"--partitions {args.partitions} --history {' '.join(map(str, args.history))} "
        f"--rescored {args.rescored} --figures {args.figures} --repeats {args.repeats}",
        "environment": facts,
        "comparisons": rows,
    }
    print(json.dumps(body, indent=2))
    if args.out is None:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(body, indent=2) + "\n")
    lines = [
        "# Listing stale days",
        "",
        f"Measured {body['measured_at']} on {facts['processor']} "
        f"({facts['cores_available']} cores, load average at start "
        f"{facts['load_average_at_start']}), SQLite instance on disk, best of {args.repeats} "
        "interleaved rounds: "
        f"`{body['command']}`. Ratio: the peer's time over nightshift's.",
        "",
        "| nightshift | peer | ratio | nightshift s | peer s | shape |",
        "|---|---|---:|---:|---:|---|",
        *(
            f"| {r['subject']} | {r['peer']} | {r['ratio']:.1f}x | {r['subject_value']:.3f} "
            f"| {r['peer_value']:.3f} | {r['note']} |"
            for r in rows
        ),
        "",
    ]
    (args.out / "results.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
