"""What every landing asset records about the files it read: their fingerprint, the day's rows and skipped files, and how naive timestamps were read."""

from __future__ import annotations

import pyarrow as pa
from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    MetadataValue,
)

from assets.errors import fail_fast_on_bad_input
from resources.landing_files import NOT_PARQUET_ENV, LandingListing
from resources.storage import DataStore

# The metadata key of the observation recording which landing files a step read.
LANDING_FINGERPRINT = "landing_fingerprint"


def record_landing_read(
    context: AssetExecutionContext, store: DataStore, dataset: str, dates: list[str]
) -> None:
    """Records on the landing asset, before reading, which files each partition has (their
    fingerprint), whether the step then succeeds or fails: the landing sensor relaunches a day
    only when its files differ from the ones a run last read."""
    for date in dates:
        fingerprint = store.landing_fingerprint(dataset, date)
        if fingerprint is not None:
            context.log_event(
                AssetObservation(
                    asset_key=AssetKey(dataset),
                    partition=date,
                    metadata={
                        LANDING_FINGERPRINT: fingerprint,
                        "read_by": context.op_def.name,
                    },
                )
            )


def landing_day(
    context: AssetExecutionContext, store: DataStore, dataset: str, schema: pa.Schema, date: str
) -> dict:
    """Validates one day of a landing dataset against its contract and counts its rows.

    Every source asset materialises through this, so a missing day or a malformed file fails
    before any model runs, naming the dataset, date, file and column. Every file below the
    partition folder is read as parquet (by its bytes, whatever its name), or skipped and
    named in the log and counted in ``landing_files_skipped``: names starting with ``_`` or
    ``.`` (``_SUCCESS``, ``_temporary/``, ``.crc``), and files that are not parquet when
    ``NIGHTSHIFT_LANDING_NOT_PARQUET=skip`` (else such a file fails the day, naming it).

    Returns:
        the day's materialisation metadata.
    """
    with fail_fast_on_bad_input():
        rows = store.count_landing(dataset, date, schema)
    folder = store.landing_path(dataset, date)
    listing = store.landing_listing(dataset, date)
    context.log.info(
        f"{dataset} {date}: {rows} rows in {len(listing.files)} parquet file(s) at "
        f"{store.uri(folder)}"
    )
    _log_skipped(context, f"{dataset} {date}", folder, listing)
    return {
        "dagster/row_count": rows,
        **landing_timezone_metadata(store, dataset),
        "landing_files_skipped": len(listing.skipped),
        "output": MetadataValue.path(store.uri(folder)),
    }


def _log_skipped(
    context: AssetExecutionContext, day: str, folder: str, listing: LandingListing
) -> None:
    """Names every skipped file: not-data names at INFO, files that are not parquet (skipped
    by the ``skip`` policy: rows a writer may have meant to land) at WARNING."""
    foreign = listing.not_parquet if listing.policy == "skip" else {}
    not_data = [path for path in listing.skipped if path not in foreign]
    if not_data:
        names = ", ".join(path[len(folder) + 1 :] for path in not_data)
        context.log.info(
            f"{day}: skipped {len(not_data)} file(s) that are not data "
            f"(names starting with '_' or '.'): {names}"
        )
    if foreign:
        names = ", ".join(f"{path[len(folder) + 1 :]} ({what})" for path, what in foreign.items())
        context.log.warning(
            f"{day}: skipped {len(foreign)} file(s) that are not parquet "
            f"({NOT_PARQUET_ENV} / landing_not_parquet: skip): {names}"
        )


def landing_timezone_metadata(store: DataStore, dataset: str) -> dict[str, str]:
    """How the dataset's timestamps without a time zone were read: as wall-clock time in the
    configured zone, or not at all (a file with them fails the run)."""
    return {"landing_timezone": store.landing_timezone(dataset) or "none (naive rejected)"}
