"""``nightshift outputs``: the output tables' history, rollback, upkeep and import.

nightshift outputs history --asset fraud_scores --date 2026-03-01
nightshift outputs rollback --asset fraud_scores --date 2026-03-01 [--to COMMIT]
nightshift outputs upkeep [--asset A] [--retention-days N]
nightshift outputs import [--asset A]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os

from policy.settings import positive_int_setting

RETENTION_ENV = "NIGHTSHIFT_OUTPUT_RETENTION_DAYS"
DEFAULT_RETENTION_DAYS = 30


def retention_days() -> int:
    """How long superseded snapshots and unreferenced files are kept, in days."""
    days = positive_int_setting(
        RETENTION_ENV,
        os.environ.get(RETENTION_ENV),
        "days superseded snapshots and unreferenced files are kept",
        f"{DEFAULT_RETENTION_DAYS} days",
    )
    return days or DEFAULT_RETENTION_DAYS


def _store(args: argparse.Namespace):
    from resources.storage import store_from_env

    if args.data_root:
        os.environ["NIGHTSHIFT_DATA_ROOT"] = args.data_root
    return store_from_env()


def _retention(text: str) -> int:
    try:
        return positive_int_setting("--retention-days", text, "days", "the default") or 0
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _cmd_history(args: argparse.Namespace) -> int:
    store = _store(args)
    history = store.tables.history(args.asset, args.date)
    if not history:
        print(f"{store.tables.identifier(args.asset)} {args.date}: no commit of this day")
        return 1
    print(f"{store.tables.identifier(args.asset)} {args.date}: {len(history)} snapshot(s)")
    print(f"{'when (UTC)':<26}{'commit':<14}{'where':<11}{'rows':>9}  model / checks / snapshot")
    for day, where in history:
        rows = day.value("rows", "")
        checks = day.value("checks") or {}
        failed = [name for name, passed in checks.items() if not passed]
        verdict = f"{len(checks) - len(failed)}/{len(checks)} checks passed" if checks else ""
        if failed:
            verdict += f" (failed: {', '.join(failed)})"
        model = day.text("model_version", "-")
        print(
            f"{day.when:<26}{day.commit:<14}{where:<11}{rows:>9}  {model}  {verdict}  "
            f"snapshot {day.snapshot_id}"
        )
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    """Rolls the asset's day back, and its companions (``<asset>_*`` tables holding the same
    commit of the day: quarantine, flagged details) with it, so they stay joined by commit."""
    from inference.engine.tables import TableError

    store = _store(args)
    tables = store.tables
    if args.to and not args.force:
        refused = [d for d, where in tables.history(args.asset, args.date) if where == "rejected"]
        if any(d.commit == args.to for d in refused):
            print(
                f"nightshift outputs rollback: commit {args.to} of {args.asset} {args.date} was "
                "refused by its blocking checks; pass --force to publish it all the same"
            )
            return 1
    try:
        now = tables.rollback(args.asset, args.date, args.to)
    except TableError as exc:
        print(f"nightshift outputs rollback: {exc}")
        return 1
    print(
        f"{tables.identifier(args.asset)} {args.date}: main holds commit {now.commit} again "
        f"(snapshot {now.snapshot_id}, {now.value('rows', '?')} rows)"
    )
    moved = {args.asset: now.snapshot_id}
    for name in table_names(store):
        if not name.startswith(f"{args.asset}_") or name.endswith("_shadow"):
            continue
        held = {d.commit for d, _ in tables.history(name, args.date)}
        current = tables.current(name, args.date)
        if now.commit in held and (current is None or current.commit != now.commit):
            moved[name] = tables.rollback(name, args.date, now.commit).snapshot_id
            print(f"{tables.identifier(name)} {args.date}: main holds commit {now.commit} again")
    _record_rollback(args.asset, args.date, now.commit, moved)
    return 0


def _record_rollback(asset: str, date: str, commit: str, moved: dict[str, int]) -> None:
    """Records the rolled-back day as a materialisation of the asset in the Dagster instance:
    the UI shows it, and the assets downstream read the restored day (``assets.handed``)."""
    from dagster import AssetMaterialization, DagsterInstance

    from assets.handed import snapshot_metadata

    with DagsterInstance.get() as instance:
        instance.report_runless_asset_event(
            AssetMaterialization(
                asset_key=asset,
                partition=date,
                description=f"nightshift outputs rollback: commit {commit} is the day again",
                metadata={**snapshot_metadata(moved), "rolled_back_to": commit},
            )
        )
    print(f"{asset} {date}: recorded in the Dagster instance at {os.environ['DAGSTER_HOME']}")


def _cmd_upkeep(args: argparse.Namespace) -> int:
    from inference.engine.table_upkeep import upkeep

    store = _store(args)
    days = args.retention_days or retention_days()
    names = [args.asset] if args.asset else table_names(store)
    now = dt.datetime.now(dt.UTC)
    for name in names:
        done = upkeep(store.tables, name, dt.timedelta(days=days), now, store.fs)
        print(done.describe(days))
    return 0


def table_names(store) -> list[str]:
    """Every output table of the store's catalog."""
    from pyiceberg.exceptions import NoSuchNamespaceError

    try:
        return sorted(
            ident[-1] for ident in store.tables.catalog.list_tables(store.tables.namespace)
        )
    except NoSuchNamespaceError:
        return []


def _cmd_import(args: argparse.Namespace) -> int:
    """Publishes each day written in the old folder layout (``outputs/<asset>/date=D/`` with
    its ``_manifest.json``) into the asset's table, with the manifest's commit and figures."""
    import pyarrow.parquet as pq

    store = _store(args)
    outputs = store.path("outputs")
    assets = [args.asset] if args.asset else _folders(store, outputs)
    imported = 0
    for asset in assets:
        for date in _old_days(store, f"{outputs}/{asset}"):
            folder = f"{outputs}/{asset}/date={date}"
            if store.tables.current(asset, date) is not None:
                print(f"{asset} {date}: already in its table; {store.uri(folder)} left as it is")
                continue
            manifest = json.loads(store.read_bytes(f"{folder}/_manifest.json"))
            files = [f"{folder}/{name}" for name in manifest.get("files", [])]
            schema = (
                pq.read_schema(files[0], filesystem=store.fs)
                if files
                else store.tables.schema(asset)
            )
            if schema is None:  # an empty day of a table that does not exist: nothing to replace
                print(f"{asset} {date}: no rows and no table yet; nothing to import")
                continue
            figures = {k: v for k, v in manifest.items() if k not in ("files",)}
            figures.setdefault("commit", f"import-{date}")

            def rows(files=files, schema=schema):
                return (pq.read_table(f, filesystem=store.fs, schema=schema) for f in files)

            staged = store.tables.stage(asset, date, schema, rows, figures)
            store.tables.publish(asset, date, staged, imported_from=store.uri(folder))
            imported += 1
            print(
                f"{asset} {date}: imported {manifest.get('rows', '?')} rows, commit {staged.commit}"
            )
    print(f"{imported} day(s) imported; the old folders can be removed once checked")
    return 0


def _folders(store, path: str) -> list[str]:
    import pyarrow.fs as pafs

    infos = store.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)


def _old_days(store, asset_dir: str) -> list[str]:
    return [
        name[len("date=") :]
        for name in _folders(store, asset_dir)
        if name.startswith("date=") and store.exists(f"{asset_dir}/{name}/_manifest.json")
    ]


def add_parser(sub: argparse._SubParsersAction, date_type) -> None:
    """Registers ``outputs`` on the ``nightshift`` command's subparsers."""
    outputs = sub.add_parser("outputs", help="the output tables: history, rollback, upkeep, import")
    commands = outputs.add_subparsers(dest="outputs_command", required=True)

    def command(name: str, help: str, func) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help)
        parser.add_argument("--data-root", help="default $NIGHTSHIFT_DATA_ROOT or .nightshift/data")
        parser.set_defaults(func=func, opens_instance=False)
        return parser

    history = command(
        "history", "list a day's snapshots: commit, model, rows, checks", _cmd_history
    )
    history.add_argument("--asset", required=True)
    history.add_argument("--date", required=True, type=date_type)
    rollback = command("rollback", "make an earlier commit of a day current again", _cmd_rollback)
    # It records the restored day in the Dagster instance for the assets downstream.
    rollback.set_defaults(opens_instance=True)
    rollback.add_argument("--asset", required=True)
    rollback.add_argument("--date", required=True, type=date_type)
    rollback.add_argument("--to", metavar="COMMIT", help="default: the commit before the current")
    rollback.add_argument(
        "--force", action="store_true", help="roll back to a commit its checks refused"
    )
    upkeep = command("upkeep", "expire old snapshots and delete orphan files", _cmd_upkeep)
    upkeep.add_argument("--asset", help="default: every output table")
    upkeep.add_argument(
        "--retention-days",
        type=_retention,
        help=f"default ${RETENTION_ENV}, else {DEFAULT_RETENTION_DAYS}",
    )
    old = command("import", "publish days written in the old folder layout", _cmd_import)
    old.add_argument("--asset", help="default: every asset with old folders")
