"""`nightshift serving`: the versions a serving target holds of an asset, and rollback; and the
publish steps `nightshift run` runs after each scoring job."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

SERVED_ASSETS = ("user_recommendations", "fraud_alerts", "document_embeddings")


def _target(args: argparse.Namespace):
    if getattr(args, "data_root", None):
        os.environ["NIGHTSHIFT_DATA_ROOT"] = args.data_root
    from resources.serving import serving_from_env

    return serving_from_env()


def _cmd_versions(args: argparse.Namespace) -> int:
    from resources.serving import ServingError

    target = _target(args)
    try:
        versions = target.versions(args.asset, include_dropped=args.all)
    except ServingError as exc:
        print(f"nightshift serving versions: {exc}", file=sys.stderr)
        return 1
    print(f"{args.asset} at {target.address()}: {len(versions)} version(s), newest first")
    if not versions:
        return 0
    print(f"  {'version':<9}{'partition':<12}{'rows':>9}  {'loaded (UTC)':<27}{'commit':<14}model")
    for v in versions:
        where = " current" if v.current else " dropped" if v.dropped else ""
        failed = [name for name, passed in v.checks.items() if not passed]
        checks = f"  checks failed: {', '.join(failed)}" if failed else ""
        print(
            f"  v{v.version:<8}{v.partition:<12}{v.rows:>9}  {v.loaded_at:<27}{v.commit[:12]:<14}"
            f"{v.model_version or '-'}{where}{checks}"
        )
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    from resources.serving import ServingError

    target = _target(args)
    try:
        before = target.current(args.asset)
        restored = target.rollback(args.asset, args.date)
    except ServingError as exc:
        print(f"nightshift serving rollback: {exc}", file=sys.stderr)
        return 1
    print(
        f"{args.asset}: v{restored.version} ({restored.partition}, {restored.rows} rows) is "
        f"current again at {target.address()}; v{before.version} ({before.partition}) is kept"
    )
    return 0


def add_parser(sub: argparse._SubParsersAction, date_type) -> None:
    """Registers ``serving`` on the ``nightshift`` command's subparsers."""
    serving = sub.add_parser(
        "serving", help="the serving store: the versions of an asset, rollback (docs/serving.md)"
    )
    commands = serving.add_subparsers(dest="serving_command", required=True)

    def command(name: str, help: str, func) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help)
        parser.add_argument("--asset", required=True, choices=SERVED_ASSETS)
        parser.add_argument("--data-root", help="default $NIGHTSHIFT_DATA_ROOT or .nightshift/data")
        parser.set_defaults(func=func, opens_instance=False)
        return parser

    versions = command("versions", "list an asset's served versions, newest first", _cmd_versions)
    versions.add_argument("--all", action="store_true", help="with the dropped ones")
    rollback = command(
        "rollback", "make the version current before the current one current again", _cmd_rollback
    )
    rollback.add_argument(
        "--date", required=True, type=date_type, help="the current version's partition"
    )


def publish_after(
    job: str, date: str, instance, run_config: dict[str, Any]
) -> list[tuple[bool, str]]:
    """Runs the publish jobs that follow the pipeline job ``job`` for ``date``; one line each,
    saying where the day is served, or why it is not, with whether the job succeeded."""
    from orchestration.definitions import defs
    from orchestration.run_report import failure_line
    from orchestration.serving import publish_jobs_after

    lines = []
    for publish in publish_jobs_after(job):
        result = defs.resolve_job_def(publish).execute_in_process(
            partition_key=date, instance=instance, raise_on_error=False, run_config=run_config
        )
        if not result.success:
            lines.append((False, failure_line(publish, date, result)))
            continue
        for event in result.get_asset_materialization_events():
            done = event.materialization
            meta = {k: getattr(v, "value", v) for k, v in done.metadata.items()}
            if "not_current" in meta:
                lines.append((True, meta["not_current"]))
                continue
            lines.append(
                (
                    True,
                    f"served {done.asset_key.to_user_string()} {date}: v{meta['current_version']} "
                    f"({meta['dagster/row_count']} rows) at {meta['served_at']} as "
                    f"'{meta['view']}'",
                )
            )
    return lines
