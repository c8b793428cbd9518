"""The `nightshift` command: demo data and a one-shot run of all pipelines on a laptop."""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from orchestration.simulate.cli import add_parser as _add_simulate
from resources.storage import REPO_ROOT, DataStore, default_data_root

DEFAULT_DAGSTER_HOME = REPO_ROOT / ".nightshift" / "dagster_home"
LOCAL_INSTANCE_YAML = REPO_ROOT / "deploy" / "local" / "dagster.yaml"
INIT_LOCK = ".nightshift-init.lock"


def yesterday() -> str:
    return (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()


def _date(text: str) -> str:
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {text!r}") from exc


def _partition(text: str) -> str:
    """A date that is one of the daily partitions (after the start date, a day that is over)."""
    from policy.partitions import partition_key_error

    date = _date(text)
    problem = partition_key_error(date)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return date


class _Parser(argparse.ArgumentParser):
    """Answers a usage error in one line (what is wrong, where the help is), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def ensure_dagster_home() -> Path:
    """Points DAGSTER_HOME at a persistent local instance, creating its config and storage once.

    Two first runs at the same moment on a fresh home each created the SQLite schema and
    stamped its version, which left two alembic heads and an instance no later command could
    open. The config is copied and the storage created under an exclusive file lock, so
    concurrent first calls wait for the first one; `make run`, `make ui` and CI call this
    before any run can start, and a run then only opens storage that exists.
    """
    from dagster import DagsterInstance

    home = Path(os.environ.get("DAGSTER_HOME") or DEFAULT_DAGSTER_HOME)
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    with (home / INIT_LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (home / "dagster.yaml").exists():
            shutil.copyfile(LOCAL_INSTANCE_YAML, home / "dagster.yaml")
        with DagsterInstance.get():  # creates the run, event-log and schedule databases
            pass
    return home


def generate(store: DataStore, end_date: str, days: int, scale: float, seed: int) -> list[tuple]:
    """Writes seeded demo landing data for the ``days`` days ending on ``end_date``."""
    from assets.fraud.demo_data import generate_day as fraud_day
    from assets.recommendations.demo_data import generate_day as recs_day
    from assets.summaries.demo_data import generate_day as docs_day

    end = dt.date.fromisoformat(end_date)
    written = []
    for offset in range(days - 1, -1, -1):
        date = (end - dt.timedelta(days=offset)).isoformat()
        for generate_day in (fraud_day, recs_day, docs_day):
            for dataset, rows in generate_day(store, date, scale=scale, seed=seed).items():
                written.append((dataset, date, rows))
    return written


def _cmd_generate(args: argparse.Namespace) -> int:
    store = DataStore(args.data_root or default_data_root())
    started = time.perf_counter()
    for dataset, date, rows in generate(store, args.date, args.days, args.scale, args.seed):
        print(f"  {dataset:<22} {date}  {rows:>9,} rows")
    print(
        f"landing data under {store.uri(store.path('landing'))} "
        f"({time.perf_counter() - started:.1f}s)"
    )
    return 0


def _cmd_init(args: argparse.Namespace) -> int:
    home = ensure_dagster_home()
    print(f"dagster instance ready at {home}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from dagster import DagsterInstance

    from orchestration.definitions import defs
    from orchestration.jobs import PIPELINES

    ensure_dagster_home()
    if args.data_root:
        os.environ["NIGHTSHIFT_DATA_ROOT"] = args.data_root
    store = DataStore(default_data_root())
    if args.generate_days:
        end = dt.date.fromisoformat(args.date)
        # Landing data for the days before and including the partition (history to train on).
        print(f"generating {args.generate_days} days of demo data ending {args.date} ...")
        generate(store, end.isoformat(), args.generate_days, args.scale, args.seed)
    rows: list[tuple] = []
    failed = False
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    with DagsterInstance.get() as instance:
        for job_name in args.jobs or list(PIPELINES):
            print(f"running {job_name} for {args.date} ...", flush=True)
            result = defs.resolve_job_def(job_name).execute_in_process(
                partition_key=args.date, instance=instance, raise_on_error=False, run_config=quiet
            )
            failed |= not result.success
            rows.extend(_materialization_rows(result))
            if not result.success:
                print(
                    f"  {job_name} FAILED in run {result.run_id}: `make ui` shows its logs",
                    file=sys.stderr,
                )
    _print_table(rows)
    return 1 if failed else 0


def _materialization_rows(result) -> list[tuple]:
    """One row per materialised asset: asset, partition, rows in, rows out, seconds, output."""
    seconds = {
        e.step_key: e.event_specific_data.duration_ms / 1000
        for e in result.all_events
        if e.is_step_success
    }
    rows = []
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        meta = {k: v.value for k, v in mat.metadata.items()}
        asset = mat.asset_key.to_user_string()
        rows_out = meta.get("rows_out", meta.get("dagster/row_count", ""))
        where = meta.get("output", "")
        rows.append(
            (
                asset,
                mat.partition or "-",
                meta.get("rows_in", ""),
                rows_out,
                f"{seconds.get(event.step_key, 0.0):.2f}",
                where,
            )
        )
    return rows


def _print_table(rows: list[tuple]) -> None:
    header = ("asset", "partition", "rows in", "rows out", "seconds", "output")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="nightshift", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="write seeded demo landing data")
    gen.add_argument("--date", type=_date, default=yesterday(), help="last day (default yesterday)")
    gen.add_argument("--days", type=int, default=1, help="number of days ending on --date")
    gen.add_argument("--scale", type=float, default=1.0, help="1 = ~100k transactions a day")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--data-root", help="default $NIGHTSHIFT_DATA_ROOT or .nightshift/data")
    gen.set_defaults(func=_cmd_generate)

    init = sub.add_parser(
        "init", help="create $DAGSTER_HOME's config and storage once, before any run starts"
    )
    init.set_defaults(func=_cmd_init)

    run = sub.add_parser("run", help="materialise the pipelines for one day, locally")
    run.add_argument(
        "--date", type=_partition, default=yesterday(), help="partition (default yesterday)"
    )
    run.add_argument(
        "--generate-days",
        type=int,
        default=0,
        help="first write this many days of demo data ending on --date",
    )
    run.add_argument("--scale", type=float, default=1.0)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--jobs", nargs="*", help="default: every pipeline job")
    run.add_argument("--data-root", help="default $NIGHTSHIFT_DATA_ROOT or .nightshift/data")
    run.set_defaults(func=_cmd_run)
    _add_simulate(sub)

    args = parser.parse_args(argv)
    if getattr(args, "days", 1) < 1:
        parser.error("--days must be at least 1")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
