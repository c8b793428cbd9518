"""Publish steps: each scored day, as published on main, loaded into the serving target as a new
version and made current in one step (resources/serving/).

A publish asset reads its parent's day at the snapshot the parent's materialisation handed on
(assets/handed.py): the day its checks passed. A day its blocking checks refused never reaches
main, and the automation condition waits for those checks, so it is never served.
"""

import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    AssetSpec,
    Config,
    Failure,
    MetadataValue,
)
from pydantic import Field

from assets.days import DayRecorder, daily_assets, day_checks
from assets.handed import handed, read_at
from assets.partitions import partition_dates
from policy.automation import after_parent_passes_checks
from resources.serving import ServingError, ServingTarget, ServingUnavailable, Version
from resources.storage import DataStore, StorageResource

GROUP = "serving"

# Scored asset -> its publish asset. Shadow assets are never published.
PUBLISHED: dict[str, str] = {
    "user_recommendations": "user_recommendations_serving",
    "fraud_alerts": "fraud_alerts_serving",
    "document_embeddings": "document_embeddings_serving",
}


def _record(store: DataStore, scored: str, date: str, pins) -> dict[str, Any]:
    """What the served version records of the day: its commit, model and check results, from
    the snapshot that was read (else main's)."""
    pinned = pins.get((scored, date))
    figures = (
        store.tables.snapshot(scored, pinned) if pinned is not None else None
    ) or store.output_figures(scored, date)
    if figures is None:
        return {"commit": "", "model_version": "", "checks": {}}
    return {
        "commit": figures.commit,
        "model_version": figures.text("model_version"),
        "checks": figures.value("checks") or {},
    }


def _models(rows: pa.Table) -> str:
    """The model versions a day's rows name, for an output whose figures record none."""
    if "model_version" not in rows.column_names:
        return ""
    return ",".join(sorted(v for v in pc.unique(rows["model_version"]).to_pylist() if v))


class PublishConfig(Config):
    """A publish step's launch settings: the Launchpad's way to roll a served day back."""

    rollback: bool = Field(
        default=False,
        description="Load nothing: make the version served before the current one current "
        "again, in one step. Launch it for the current version's partition (one day), as "
        "`nightshift serving rollback --asset A --date D` does; the current version is kept.",
    )


def left_current(serving: ServingTarget, asset: str) -> str:
    """What readers still see after a failed load, in words."""
    try:
        current = serving.current(asset)
    except ServingError:
        return "the store could not be asked; a load that did not finish changes nothing current"
    if current is None:
        return "nothing was served before, and nothing is now"
    return f"v{current.version} ({current.partition}) is still current"


def not_loaded(
    serving: ServingTarget, asset: str, why: str, fix: str, allow_retries: bool = True
) -> Failure:
    """The step's failure when nothing was loaded: why, what readers still see, and the fix."""
    left = left_current(serving, asset)
    return Failure(
        description=f"{why}; {left}. {fix}",
        metadata={"address": serving.address(), "left_current": left},
        allow_retries=allow_retries,
    )


def unreachable(scored: str, date: str, what: str, exc: ServingUnavailable) -> Failure:
    """The step's failure when the serving store cannot be reached: once, with the fix."""
    return Failure(
        description=f"{scored} {date}: not {what}: the serving store {exc.address} is "
        f"unreachable; nothing current changed there. Fix: {exc.fix}.",
        metadata={"address": exc.address, "cause": str(exc.__cause__ or exc)},
        # The same step against the same address fails the same way: fail once.
        allow_retries=False,
    )


def publish_day(
    context: AssetExecutionContext,
    store: DataStore,
    serving: ServingTarget,
    scored: str,
    date: str,
) -> tuple[Version | None, Version | None, dict[tuple[str, str], int]]:
    """Loads ``scored``'s published ``date`` as a new version and makes it current; returns it
    (None when a later day is current), the version current before and the snapshots read.
    Fails the step saying what stayed current."""
    pins = handed(context, store, [scored], date)
    try:
        with store.pinned(pins):
            rows: pa.Table = store.read_output(scored, date)
            record = _record(store, scored, date, pins)
    except FileNotFoundError as exc:
        # Launched for a day that was never published (or whose scoring failed): nothing is
        # loaded, and the product keeps reading what it did.
        raise not_loaded(
            serving,
            scored,
            f"{scored} {date}: not served: {exc}",
            f"Fix: materialize {scored} for {date} first (its publish follows once its checks "
            "pass).",
            allow_retries=False,
        ) from exc
    record["model_version"] = record["model_version"] or _models(rows)
    # A commit that records no check results (a day published by an older nightshift): the
    # results the automation waited for are those Dagster holds for the day.
    record["checks"] = record["checks"] or day_checks(context, scored, date)
    try:
        before = serving.current(scored)
        if before is not None and before.partition > date:
            # A re-scored older day (a backfill, a rescore after a promotion) must not put the
            # product back on an earlier day than the one it reads.
            return None, before, pins
        loaded = serving.publish(scored, rows, partition=date, **record)
    except ServingUnavailable as exc:
        raise unreachable(scored, date, "served", exc) from exc
    except Exception as exc:
        raise not_loaded(
            serving,
            scored,
            f"{scored} {date}: the load into {serving.address()} failed ({exc})",
            "Fix the cause and re-run the step: it loads a new version.",
        ) from exc
    return loaded, before, pins


def rollback_day(serving: ServingTarget, scored: str, date: str) -> tuple[Version, Version]:
    """Makes the version before ``scored``'s current one current again; returns it and the
    version it replaced. A refusal (not the current day, nothing kept to go back to, the store
    down) fails the step once, saying that nothing changed."""
    try:
        before = serving.current(scored)
        restored = serving.rollback(scored, date)
    except ServingUnavailable as exc:
        raise unreachable(scored, date, "rolled back", exc) from exc
    except ServingError as exc:
        raise Failure(
            description=f"{scored} {date}: not rolled back: {exc}",
            metadata={"address": serving.address(), "left_current": left_current(serving, scored)},
            # A refusal is an answer, not an accident: the same request is refused again.
            allow_retries=False,
        ) from exc
    assert before is not None  # rollback refuses when nothing is served
    return restored, before


def publish_asset(scored: str) -> AssetsDefinition:
    """The publish asset of ``scored``: daily, downstream of it, gated on its checks."""
    name = PUBLISHED[scored]

    def _publish(
        context: AssetExecutionContext,
        config: PublishConfig,
        storage: StorageResource,
        serving: ServingTarget,
    ):
        store, days = storage.store(), DayRecorder(context)
        dates = partition_dates(context)
        if config.rollback:
            if len(dates) != 1:
                raise Failure(
                    description=f"{name}: a rollback is launched for one day, the current "
                    f"version's partition, not {len(dates)} ({dates[0]}..{dates[-1]}); "
                    "nothing changed",
                    allow_retries=False,
                )
            restored, before = rollback_day(serving, scored, dates[0])
            rolled = (
                f"{scored} {dates[0]}: rolled back: v{restored.version} ({restored.partition}, "
                f"{restored.rows} rows) is current again at {serving.address()}; "
                f"v{before.version} ({before.partition}) is kept"
            )
            context.log.info(rolled)
            metadata = {
                "current_version": restored.version,
                "current_partition": restored.partition,
                "rolled_back_from": before.version,
                "rolled_back": rolled,
                "dagster/row_count": restored.rows,
                "served_at": MetadataValue.text(serving.address()),
                "view": scored,
                "table": restored.table,
                "commit": restored.commit,
                "model_version": restored.model_version,
            }
            yield from days.record(name, dates[0], metadata)
            yield from days.finish()
            return
        for date in dates:
            started = time.perf_counter()
            version, before, pins = publish_day(context, store, serving, scored, date)
            if version is None:
                assert before is not None
                kept = (
                    f"{scored} {date}: not made current: v{before.version} serves a later day, "
                    f"{before.partition}, at {serving.address()}"
                )
                context.log.info(kept)
                metadata = {
                    "current_version": before.version,
                    "not_current": kept,
                    "served_at": MetadataValue.text(serving.address()),
                    "view": scored,
                }
                yield from days.record(name, date, metadata)
                continue
            context.log.info(
                f"{scored} {date}: v{version.version} ({version.rows} rows) is current at "
                f"{serving.address()} as '{scored}'"
            )
            metadata = {
                "current_version": version.version,
                "dagster/row_count": version.rows,
                "load_seconds": round(time.perf_counter() - started, 3),
                "previous_version": before.version if before is not None else 0,
                "served_at": MetadataValue.text(serving.address()),
                "view": scored,
                "table": version.table,
                "commit": version.commit,
                **read_at(pins),
            }
            yield from days.record(name, date, metadata)
        yield from days.finish()

    # The op is named after the asset: every publish asset comes from this one function.
    _publish.__name__ = name
    return daily_assets(
        AssetSpec(
            name,
            description=f"{scored}'s published day, served as a new version of the view "
            f"'{scored}' in the serving store (docs/serving.md), made current in one step.",
            # Never a day its parent's blocking checks refused.
            deps=[scored],
            automation_condition=after_parent_passes_checks,
            kinds={"sql"},
            group_name=GROUP,
        )
    )(_publish)


user_recommendations_serving = publish_asset("user_recommendations")
fraud_alerts_serving = publish_asset("fraud_alerts")
# Its versions carry an ANN index over the vectors: ``ServingTarget.search`` finds by cosine.
document_embeddings_serving = publish_asset("document_embeddings")
