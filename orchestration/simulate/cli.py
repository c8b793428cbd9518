"""``nightshift simulate``: the capacity policies replayed over real spot traces.

nightshift simulate                       # every cached trace, the full sweep, a table
nightshift simulate --json                # the same figures, one record per policy/trace
nightshift simulate --trace my.json       # any trace file of the same JSON format
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from orchestration.simulate.sweep import POLICIES, Settings, by_setting, records, simulate_trace
from orchestration.simulate.traces import CACHE, load_trace, real_trace_paths
from policy.prices import NodePrices, node_prices, node_prices_from_env

ONLINE = [p for p in POLICIES if p != "optimum"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Registers ``simulate`` on the ``nightshift`` command's subparsers."""
    sim = sub.add_parser(
        "simulate", help="replay the spot/on-demand policies over spot traces, against the optimum"
    )
    sim.add_argument("--json", action="store_true", help="print records as JSON, not a table")
    sim.add_argument(
        "--by-setting",
        action="store_true",
        help="with --json: one record per policy and setting (fraction, overhead) instead",
    )
    sim.add_argument(
        "--trace",
        action="append",
        type=Path,
        metavar="PATH",
        help="a trace file ({metadata: {gap_seconds}, data: [...]}); repeat for more; "
        f"default every trace cached in {CACHE.relative_to(CACHE.parents[1])}",
    )
    sim.add_argument("--traces-dir", type=Path, default=CACHE, help=argparse.SUPPRESS)
    sim.add_argument(
        "--fractions",
        type=float,
        nargs="+",
        default=list(Settings.fractions),
        help="work as a fraction of the 01:00-07:00 window (default 0.3 .. 0.9)",
    )
    sim.add_argument(
        "--overheads",
        type=float,
        nargs="+",
        default=list(Settings.overhead_minutes),
        help="restart overheads d in minutes (default 2 10)",
    )
    sim.add_argument("--node-type", help="prices from policy/prices.json (default g5.xlarge)")
    sim.add_argument("--stride-hours", type=float, default=Settings.stride_hours)
    sim.add_argument(
        "--on-demand-after",
        type=int,
        default=Settings.on_demand_after,
        help="the count-based switch's threshold (default 2, the resource's default)",
    )
    sim.add_argument(
        "--deadline-on-demand-after",
        type=int,
        default=None,
        help="give the deadline-aware policy the count bound too (default: off)",
    )
    sim.add_argument(
        "--min-pace",
        type=float,
        default=Settings.min_pace,
        help="the deadline-aware policy's pace floor (uniform-progress is the same with 0)",
    )
    sim.add_argument(
        "--no-hop-back",
        action="store_true",
        help="deadline-aware policies keep an on-demand node to the end (production asks the "
        "policy only at launches and retries)",
    )
    sim.add_argument("--workers", type=int, default=1, help="processes, one trace each")
    sim.set_defaults(func=run, opens_instance=False)


def run(args: argparse.Namespace) -> int:
    """Runs the sweep and prints it; 2 when there are no traces to replay."""
    try:
        traces = _trace_paths(args)
        prices = _prices(args.node_type)
    except (FileNotFoundError, ValueError) as exc:
        print(f"nightshift simulate: {exc}", file=sys.stderr)
        return 2
    settings = Settings(
        fractions=tuple(args.fractions),
        overhead_minutes=tuple(args.overheads),
        stride_hours=args.stride_hours,
        on_demand_after=args.on_demand_after,
        deadline_on_demand_after=args.deadline_on_demand_after,
        min_pace=args.min_pace,
        hop_back=not args.no_hop_back,
    )
    try:
        per_trace = simulate_all(traces, prices, settings, args.workers)
    except ValueError as exc:
        print(f"nightshift simulate: {exc}", file=sys.stderr)
        return 2
    rows = records(per_trace, prices)
    if args.json:
        print(json.dumps(by_setting(per_trace) if args.by_setting else rows, indent=1))
    else:
        print_tables(rows, by_setting(per_trace), prices)
    return 0


def simulate_all(
    traces: list[tuple[str, Path]], prices: NodePrices, settings: Settings, workers: int = 1
) -> dict:
    """Tallies per trace name, traces in the order given."""
    jobs = [(name, path, prices, settings) for name, path in traces]
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_one, jobs))
    else:
        results = [_one(job) for job in jobs]
    return dict(results)


def _one(job: tuple[str, Path, NodePrices, Settings]) -> tuple[str, dict]:
    name, path, prices, settings = job
    return name, simulate_trace(load_trace(path, name), prices, settings)


def _trace_paths(args: argparse.Namespace) -> list[tuple[str, Path]]:
    if not args.trace:
        return real_trace_paths(args.traces_dir)
    paths = []
    for path in args.trace:
        if not path.is_file():
            raise FileNotFoundError(f"--trace {path}: no such file")
        paths.append((str(path), path))
    return paths


def _prices(node_type: str | None) -> NodePrices:
    env = node_prices_from_env()
    if node_type is None or node_type == env.node_type:
        return env
    return node_prices(node_type)


def print_tables(rows: list[dict], settings_rows: list[dict], prices: NodePrices) -> None:
    """Per trace: each policy's cost as a multiple of the optimum and its deadline misses."""
    print(
        f"{prices.label}: spot ${prices.spot_per_hour:.4f}/h, on-demand "
        f"${prices.on_demand_per_hour:.4f}/h ({prices.source})"
    )
    print("cells: cost / offline optimum, deadline misses\n")
    by_trace: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_trace.setdefault(row["trace"], {})[row["policy"]] = row
    width = max(len(t) for t in by_trace)
    print(f"{'trace':<{width}}  {'nights':>6}  " + "  ".join(f"{p:>16}" for p in ONLINE))
    for trace, cells in by_trace.items():
        nights = cells["on-demand"]["nights"]
        line = "  ".join(
            f"{cells[p]['cost_vs_optimum']:>8.3f}x {cells[p]['misses']:>5}" for p in ONLINE
        )
        print(f"{trace:<{width}}  {nights:>6}  {line}")
    print("\n'all': cost / optimum is the mean of the traces' ratios")
    print("\n$ per night and saving against on-demand, all traces:")
    for p in POLICIES:
        row = by_trace["all"][p]
        print(
            f"  {p:<17} ${row['usd_per_night']:>8.2f}  saving {row['saving_vs_on_demand']:>6.1%}"
            f"  misses {row['misses']:>5} (of which on-demand met {row['misses_on_demand_met']})"
        )
    print("\nby setting (work/window, restart overhead): misses and mean cost / optimum")
    for p in ONLINE:
        cells = [r for r in settings_rows if r["policy"] == p]
        text = "  ".join(
            f"{r['fraction']:g}/{r['overhead_minutes']:g}m {r['misses']}|"
            f"{r['mean_cost_vs_optimum']:.2f}"
            for r in cells
        )
        print(f"  {p:<17} {text}")
