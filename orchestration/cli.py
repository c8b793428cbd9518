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

from orchestration.outputs_cli import add_parser as _add_outputs
from orchestration.serving_cli import add_parser as _add_serving
from orchestration.serving_cli import publish_after
from orchestration.simulate.cli import add_parser as _add_simulate
from resources.storage import REPO_ROOT, DataStore, default_data_root, store_from_env

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
    from assets.partitions import partition_key_error

    date = _date(text)
    problem = partition_key_error(date)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return date


def _pipeline_job(text: str) -> str:
    """One of the pipeline jobs (imported only when --jobs is given: it loads Dagster)."""
    from orchestration.jobs import PIPELINES

    if text not in PIPELINES:
        raise argparse.ArgumentTypeError(
            f"not a pipeline job: {text!r} (choose from {', '.join(PIPELINES)})"
        )
    return text


class _Parser(argparse.ArgumentParser):
    """Answers a usage error in one line (what is wrong, where the help is), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def ensure_dagster_home(refresh_config: bool = False) -> Path:
    """Points DAGSTER_HOME at a persistent local instance, creating its config and storage once.

    Two first runs at the same moment on a fresh home each created the SQLite schema and
    stamped its version, which left two alembic heads and an instance no later command could
    open. The config is copied and the storage created under an exclusive file lock, so
    concurrent first calls wait for the first one; every `nightshift` command that opens the
    instance calls this first (see :func:`main`), `make ui` and CI through `nightshift init`,
    and a run then only opens storage that exists.

    Args:
        refresh_config: also replace the home's ``dagster.yaml`` when the shipped one is newer
            (what `make ui` asks for), under the same lock.
    """
    from dagster import DagsterInstance

    home = Path(os.environ.get("DAGSTER_HOME") or DEFAULT_DAGSTER_HOME)
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    with (home / INIT_LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        _install_config(home / "dagster.yaml", refresh_config)
        with DagsterInstance.get():  # creates the run, event-log and schedule databases
            pass
    return home


def _install_config(target: Path, refresh: bool) -> None:
    """Copies the shipped instance config to ``target`` when it is missing (or, refreshing,
    older than the shipped one), through a rename so no reader sees half a file."""
    if target.exists() and not (
        refresh and LOCAL_INSTANCE_YAML.stat().st_mtime > target.stat().st_mtime
    ):
        return
    partial = target.with_name(f".{target.name}.partial")
    shutil.copyfile(LOCAL_INSTANCE_YAML, partial)
    os.replace(partial, target)


def generate(store: DataStore, end_date: str, days: int, scale: float, seed: int) -> list[tuple]:
    """Writes seeded demo landing data for the ``days`` days ending on ``end_date``: every
    domain's that declares a ``demo_day`` (assets/wiring.py), in the domains' order."""
    from assets.domains import DOMAINS

    demo_days = [d.demo_day for d in DOMAINS if d.demo_day is not None]
    end = dt.date.fromisoformat(end_date)
    written = []
    for offset in range(days - 1, -1, -1):
        date = (end - dt.timedelta(days=offset)).isoformat()
        for demo_day in demo_days:
            for dataset, rows in demo_day(store, date, scale, seed).items():
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
    print(f"dagster instance ready at {os.environ['DAGSTER_HOME']}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    """Runs each job for the day in this process; one line per job that could not run or failed
    (the full traces go to a log file, or to the terminal with --verbose), exit status 1 then."""
    # Read when the definitions are imported, as every engine setting is. The line goes to a
    # copy of this terminal's stderr: while a step runs, Dagster's log capture redirects the
    # process's own.
    os.environ.setdefault("NIGHTSHIFT_PROGRESS_LINE", "1" if args.progress else "0")
    os.environ.setdefault("NIGHTSHIFT_PROGRESS_FD", str(os.dup(sys.stderr.fileno())))
    from dagster import DagsterInstance

    from orchestration.definitions import defs
    from orchestration.jobs import PIPELINES
    from orchestration.run_report import failure_line, materialization_rows, print_table

    if args.data_root:
        os.environ["NIGHTSHIFT_DATA_ROOT"] = args.data_root
    store = store_from_env()
    if args.generate_days:
        end = dt.date.fromisoformat(args.date)
        # Landing data for the days before and including the partition (history to train on).
        print(f"generating {args.generate_days} days of demo data ending {args.date} ...")
        generate(store, end.isoformat(), args.generate_days, args.scale, args.seed)
    rows: list[tuple] = []
    problems: list[str] = []
    # Dagster's console log prints every failed step with its stack trace and its causes; the
    # run's events stay in the instance (`make ui`) and the traces go to a log file.
    level = "WARNING" if args.verbose else "CRITICAL"
    run_config = {"loggers": {"console": {"config": {"log_level": level}}}}
    jobs = args.jobs or list(PIPELINES)
    # Every job's day is served after it unless --jobs picks jobs (then only with --serve).
    serve = args.serve if args.serve is not None else not args.jobs
    served: list[tuple[bool, str]] = []
    with DagsterInstance.get() as instance:
        for job_name in jobs:
            missing = _missing_landing(store, job_name, args.date, args.data_root)
            if missing:
                problems.append(f"{job_name} {args.date}: not run: {missing}")
                print(problems[-1], file=sys.stderr)
                continue
            print(f"running {job_name} for {args.date} ...", flush=True)
            result = defs.resolve_job_def(job_name).execute_in_process(
                partition_key=args.date,
                instance=instance,
                raise_on_error=False,
                run_config=run_config,
            )
            rows.extend(materialization_rows(result))
            if not result.success:
                problems.append(failure_line(job_name, args.date, result))
                print(problems[-1], file=sys.stderr)
            elif serve:
                for ok, line in publish_after(job_name, args.date, instance, run_config):
                    served.append((ok, line))
                    print(line, file=sys.stdout if ok else sys.stderr)
    if rows:
        print_table(rows)
    unserved = _print_where_served(served) if served else 0
    if problems:
        print(f"{len(problems)} of {len(jobs)} job(s) did not score {args.date}", file=sys.stderr)
    return 1 if problems or unserved else 0


def _print_where_served(lines: list[tuple[bool, str]]) -> int:
    """Says where the results are served; returns how many publish jobs failed."""
    from resources.serving import serving_from_env

    where = serving_from_env().address()
    print(
        f"results served at {where}, each output under its own name (`nightshift serving versions "
        "--asset user_recommendations`, docs/serving.md)"
    )
    failed = [line for ok, line in lines if not ok]
    if failed:
        print(f"{len(failed)} publish job(s) did not serve their day", file=sys.stderr)
    return len(failed)


def _cmd_promote(args: argparse.Namespace) -> int:
    """Runs the promotion job for one model in this process; one line says what happened."""
    from dagster import DagsterInstance

    from inference.models.registry import default_actor
    from orchestration.definitions import defs
    from orchestration.promotion import PROMOTE_JOB, promotion_tags

    if args.force and not args.reason.strip():
        print('nightshift promote: --force needs --reason "why"', file=sys.stderr)
        return 2
    if args.data_root:
        os.environ["NIGHTSHIFT_DATA_ROOT"] = args.data_root
    by = args.by or default_actor()
    fields = ("model", "version", "force", "reason")
    config = {k: getattr(args, k) for k in fields} | {"by": by}
    quiet = {"console": {"config": {"log_level": "CRITICAL"}}}
    with DagsterInstance.get() as instance:
        result = defs.resolve_job_def(PROMOTE_JOB).execute_in_process(
            run_config={"ops": {"promote_model": {"config": config}}, "loggers": quiet},
            instance=instance,
            tags=promotion_tags(args.model, by, args.force, args.reason),
            raise_on_error=False,
        )
    if not result.success:
        [failure] = result.get_step_failure_events()
        print(f"{args.model}: not promoted: {failure.step_failure_data.error.message.strip()}",
              file=sys.stderr)  # fmt: skip
        return 1
    print(result.output_for_node("promote_model"))
    return 0


def _missing_landing(store: DataStore, job_name: str, date: str, data_root: str | None) -> str:
    """Why ``job_name`` cannot run for ``date`` before it starts: a landing dataset it reads
    has no files for the day. Empty when every one has some (a run judges what they hold)."""
    from orchestration.jobs import landing_inputs

    where = f" --data-root {data_root}" if data_root else ""
    for dataset in landing_inputs(job_name):
        if store.landing_fingerprint(dataset, date) is None:
            path = store.uri(store.landing_path(dataset, date))
            return (
                f"no landing data for {dataset} at {path} (land it there, or generate demo "
                f"data with `nightshift generate --date {date}{where}`)"
            )
    return ""


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _add_generate(sub) -> None:
    gen = sub.add_parser("generate", help="write seeded demo landing data")
    gen.add_argument("--date", type=_date, default=yesterday(), help="last day (default yesterday)")
    gen.add_argument(
        "--days", type=_at_least_one, default=1, help="number of days ending on --date"
    )
    gen.add_argument("--scale", type=float, default=1.0, help="1 = ~100k transactions a day")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--data-root", help="default $NIGHTSHIFT_DATA_ROOT or .nightshift/data")
    gen.set_defaults(func=_cmd_generate, opens_instance=False)


def _add_init(sub) -> None:
    init = sub.add_parser(
        "init", help="create $DAGSTER_HOME's config and storage once, before any run starts"
    )
    init.add_argument(
        "--refresh-config",
        action="store_true",
        help="replace $DAGSTER_HOME/dagster.yaml when deploy/local/dagster.yaml is newer",
    )
    init.set_defaults(func=_cmd_init, opens_instance=True)


def _add_run(sub) -> None:
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
    run.add_argument("--jobs", nargs="*", type=_pipeline_job, help="default: every pipeline job")
    run.add_argument("--data-root", help="default $NIGHTSHIFT_DATA_ROOT or .nightshift/data")
    run.add_argument(
        "--serve",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve each scored day (docs/serving.md); default: yes, unless --jobs is given",
    )
    run.add_argument(
        "--verbose",
        action="store_true",
        help="print Dagster's warnings and errors with their stack traces as the runs go",
    )
    run.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="show each scoring day's progress on stderr: in place on a terminal, else a line "
        "a minute (default: yes; $NIGHTSHIFT_PROGRESS_LINE, when set, wins)",
    )
    run.set_defaults(func=_cmd_run, opens_instance=True)


def _add_promote(sub) -> None:
    promote = sub.add_parser(
        "promote",
        help="make a model version the champion: through the promotion gate, or past it "
        "with --force and a reason",
    )
    promote.add_argument("model", help="the model's name, e.g. fraud_model")
    promote.add_argument("--version", default="", help="default: the challenger")
    promote.add_argument("--force", action="store_true", help="promote without the gate")
    promote.add_argument("--reason", default="", help="why (required with --force)")
    promote.add_argument("--by", default="", help="who (default $NIGHTSHIFT_USER or the login)")
    promote.add_argument("--data-root", help="default $NIGHTSHIFT_DATA_ROOT or .nightshift/data")
    promote.set_defaults(func=_cmd_promote, opens_instance=True)


def _cmd_stale(args: argparse.Namespace) -> int:
    """Lists the days scored by a version other than the champion, newest first; exit status 0
    whether or not any is stale (a listing, not a check)."""
    from dagster import DagsterInstance

    from orchestration.rescore import TARGETS, last_window, stale_in

    if args.data_root:
        os.environ["NIGHTSHIFT_DATA_ROOT"] = args.data_root
    store = store_from_env()
    targets = [t for t in TARGETS if args.asset in (None, t.asset)]
    dates = last_window(args.window)
    with DagsterInstance.get() as instance:
        for target in targets:
            stale = stale_in(instance, store, target, dates)
            span = f"{dates[0]}..{dates[-1]}" if dates else "no day is over yet"
            print(f"{target.asset} ({target.model}): {len(stale)} stale day(s) in {span}")
            for day in stale:
                print(f"  {day.date}  scored by {day.scored_by}  champion {day.champion}")
    return 0


def _stale_asset(text: str) -> str:
    """A scored asset whose model the registry holds (imported only when given: loads Dagster)."""
    from orchestration.rescore import TARGETS_BY_ASSET

    if text not in TARGETS_BY_ASSET:
        raise argparse.ArgumentTypeError(
            f"not a scored asset with a registry model: {text!r} "
            f"(choose from {', '.join(TARGETS_BY_ASSET)})"
        )
    return text


def _add_stale(sub) -> None:
    stale = sub.add_parser(
        "stale", help="list the days scored by a model version other than the champion"
    )
    stale.add_argument(
        "asset", nargs="?", type=_stale_asset, help="default: every scored asset with a model"
    )
    stale.add_argument(
        "--window",
        type=_at_least_one,
        default=30,
        help="the last N daily partitions, ending yesterday (default 30)",
    )
    stale.add_argument("--data-root", help="default $NIGHTSHIFT_DATA_ROOT or .nightshift/data")
    stale.set_defaults(func=_cmd_stale, opens_instance=True)


def _cmd_ui(args: argparse.Namespace) -> int:
    from orchestration.dev_server import exec_dagster_dev

    exec_dagster_dev(args.host, args.port)
    return 1  # not reached: the process is now `dagster dev`


def _add_ui(sub) -> None:
    ui = sub.add_parser(
        "ui",
        help="refresh $DAGSTER_HOME's config and start `dagster dev` (webserver and daemon)",
    )
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=3000)
    ui.set_defaults(func=_cmd_ui, opens_instance=True, refresh_config=True)


def build_parser() -> argparse.ArgumentParser:
    """The command line: one ``_add_<command>(sub)`` a subcommand. A command that opens the
    Dagster instance sets ``opens_instance=True``, and :func:`main` initialises the instance
    under the init lock before it runs."""
    parser = _Parser(prog="nightshift", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_init(sub)
    _add_run(sub)
    _add_stale(sub)
    _add_promote(sub)
    _add_ui(sub)
    _add_simulate(sub)
    _add_outputs(sub, _date)
    _add_serving(sub, _date)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.opens_instance:
        # Before the command touches the instance: two commands started at once on a fresh
        # DAGSTER_HOME would otherwise both create its storage (see ensure_dagster_home).
        ensure_dagster_home(refresh_config=getattr(args, "refresh_config", False))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
