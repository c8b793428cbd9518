"""Landing timestamps without a time zone: rejected by name, or read in the dataset's landing timezone."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from dagster import DagsterInstance, materialize
from helpers import asset_metadata, cpu_resources

from assets.documents.assets import documents
from assets.documents.demo_data import generate_day as generate_documents
from assets.documents.schemas import DATASET, DOCUMENTS_SCHEMA
from assets.fraud.assets import fraud_model, fraud_scores, transactions
from assets.fraud.demo_data import generate_day as generate_transactions
from assets.fraud.schemas import TRANSACTIONS, TRANSACTIONS_SCHEMA
from assets.recommendations import interactions
from assets.recommendations.demo_data import generate_day as generate_interactions
from assets.recommendations.schemas import INTERACTIONS, INTERACTIONS_SCHEMA
from inference.engine.streaming import LandingTimezones, NonexistentTimeError, localize
from orchestration.resources import build_resources
from resources.storage import DataStore, LandingDataError, StorageResource

NEW_YORK = "America/New_York"
DAY = "2026-03-02"  # EST (UTC-5) all day; the change to summer time is on 2026-03-08


def _naive(table: pa.Table, column: str, zone: str | None) -> pa.Table:
    """The column as a naive wall clock would write it: in ``zone`` (UTC when None), no tz."""
    values = table[column]
    if zone is not None:
        values = pc.cast(values, pa.timestamp("us", tz=zone))
    naive = pc.local_timestamp(values) if zone is not None else pc.cast(values, pa.timestamp("us"))
    index = table.schema.get_field_index(column)
    return table.set_column(index, column, naive)


def _failure(result, step: str) -> str:
    assert not result.success
    failures = {e.step_key: e for e in result.get_step_failure_events()}
    assert set(failures) == {step}, failures
    return failures[step].step_failure_data.error.message


DOMAINS = {
    "transactions": (transactions, generate_transactions, TRANSACTIONS, TRANSACTIONS_SCHEMA, "ts"),
    "interactions": (interactions, generate_interactions, INTERACTIONS, INTERACTIONS_SCHEMA, "ts"),
    "documents": (documents, generate_documents, DATASET, DOCUMENTS_SCHEMA, "published_at"),
}


@pytest.mark.parametrize("domain", list(DOMAINS))
def test_naive_timestamps_fail_naming_file_column_partition_and_type(tmp_path, domain) -> None:
    asset, generate, dataset, schema, column = DOMAINS[domain]
    store = DataStore(str(tmp_path / "data"))
    generate(store, DAY, scale=0.02)
    table = _naive(store.read_landing(dataset, DAY, schema), column, None)
    store.write_landing(dataset, DAY, table)
    (file,) = store.landing_files(dataset, DAY)
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [asset],
            partition_key=DAY,
            resources={"storage": StorageResource(data_root=str(tmp_path / "data"))},
            instance=instance,
            raise_on_error=False,
        )
    message = _failure(result, asset.op.name)
    assert f"{file} (dataset '{dataset}', date {DAY})" in message
    assert (
        f"column '{column}' is timestamp[us] without a time zone; "
        "expected timestamp[us, tz=UTC]" in message
    )
    assert "landing timezone" in message and "NIGHTSHIFT_LANDING_TIMEZONE" in message


@pytest.fixture(scope="module")
def fraud(tmp_path_factory) -> dict:
    """A trained fraud model under a data root whose transactions land in New York time."""
    root = tmp_path_factory.mktemp("landing_tz") / "data"
    generate_transactions(DataStore(str(root)), "2026-02-27", scale=0.02)
    resources = {
        **cpu_resources(root),
        "storage": StorageResource(data_root=str(root), landing_timezone=NEW_YORK),
    }
    with DagsterInstance.ephemeral() as instance:
        assert materialize([fraud_model], resources=resources, instance=instance).success
    return {"root": root, "resources": resources}


def test_naive_timestamps_are_read_as_the_landing_timezone(fraud: dict) -> None:
    utc_store = DataStore(str(fraud["root"]))
    generate_transactions(utc_store, DAY, scale=0.02)
    day = utc_store.read_landing(TRANSACTIONS, DAY, TRANSACTIONS_SCHEMA)
    # New York wall clock for every row: the day's first five hours read 19:00-23:59 on the
    # day before, so read as UTC they would fall outside the day, more than the 1% limit.
    local = _naive(day, "ts", NEW_YORK)
    five = pa.scalar(dt.datetime(2026, 3, 2, 5, tzinfo=dt.UTC), day["ts"].type)
    early = pc.sum(pc.less(day["ts"], five)).as_py()
    assert early > 0.01 * day.num_rows
    # Three rows at 22:00 New York time on the day itself: inside the day read as UTC, but
    # 03:00 UTC the next day in truth, so they are quarantined as outside the day.
    late = [5, 6, 7]
    ts = local["ts"].to_pylist()
    for row in late:
        ts[row] = dt.datetime(2026, 3, 2, 22, 0, row)
    local = local.set_column(
        local.schema.get_field_index("ts"), "ts", pa.array(ts, pa.timestamp("us"))
    )
    utc_store.write_landing(TRANSACTIONS, DAY, local)

    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [transactions, fraud_scores],
            partition_key=DAY,
            resources=fraud["resources"],
            instance=instance,
            raise_on_error=False,
        )
    assert result.success
    store = fraud["resources"]["storage"].store()
    read = store.read_landing(TRANSACTIONS, DAY, TRANSACTIONS_SCHEMA)
    assert read["ts"].type == TRANSACTIONS_SCHEMA.field("ts").type
    keep = np.setdiff1d(np.arange(day.num_rows), late)
    assert read["ts"].take(keep).equals(day["ts"].take(keep))  # the same instants as generated
    assert read["ts"][5].as_py() == dt.datetime(2026, 3, 3, 3, 0, 5, tzinfo=dt.UTC)

    meta = asset_metadata(result, "fraud_scores")
    held = store.read_output("fraud_scores_quarantine", DAY)
    scores = store.read_output("fraud_scores", DAY)
    assert meta["quarantine_reasons"] == {"ts_outside_day": 3}
    assert sorted(held["transaction_id"].to_pylist()) == sorted(
        day["transaction_id"].take(late).to_pylist()
    )
    assert meta["rows_in"] == day.num_rows == scores.num_rows + held.num_rows
    assert meta["landing_timezone"] == NEW_YORK
    assert asset_metadata(result, "transactions")["landing_timezone"] == NEW_YORK

    # Read as UTC (now a choice someone has to make), the same file shifts the evening rows
    # out of the day and the day is blocked, with the reason counted.
    as_utc = {
        **fraud["resources"],
        "storage": StorageResource(data_root=str(fraud["root"]), landing_timezone="UTC"),
    }
    with DagsterInstance.ephemeral() as instance:
        blocked = materialize(
            [transactions], partition_key=DAY, resources=as_utc, instance=instance,
            raise_on_error=False,
        )  # fmt: skip
    assert "blocking asset check" in _failure(blocked, "transactions")
    verdict = {c.check_name: c for c in blocked.get_asset_check_evaluations()}
    written = local["ts"].to_pylist()
    outside = sum(not dt.datetime(2026, 3, 2) <= t < dt.datetime(2026, 3, 3) for t in written)
    assert f"ts_outside_day {outside};" in verdict["transaction_values_in_range"].description


def test_without_a_landing_timezone_the_metadata_says_naive_is_rejected(tmp_path) -> None:
    store = DataStore(str(tmp_path / "data"))
    generate_documents(store, DAY, scale=0.02)
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [documents],
            partition_key=DAY,
            resources={"storage": StorageResource(data_root=str(tmp_path / "data"))},
            instance=instance,
            raise_on_error=False,
        )
    assert asset_metadata(result, "documents")["landing_timezone"] == "none (naive rejected)"


def test_a_time_the_clocks_skip_fails_naming_the_file_and_the_reading(tmp_path) -> None:
    store = DataStore(str(tmp_path / "data"), landing_timezone=f"{INTERACTIONS}={NEW_YORK}")
    generate_interactions(store, "2026-03-08", scale=0.02)
    day = _naive(store.read_landing(INTERACTIONS, "2026-03-08", INTERACTIONS_SCHEMA), "ts", None)
    ts = day["ts"].to_pylist()
    ts[3] = dt.datetime(2026, 3, 8, 2, 30)  # New York goes from 02:00 straight to 03:00
    store.write_landing(
        INTERACTIONS, "2026-03-08", day.set_column(2, "ts", pa.array(ts, pa.timestamp("us")))
    )
    (file,) = store.landing_files(INTERACTIONS, "2026-03-08")
    with pytest.raises(LandingDataError) as error:
        list(store.iter_landing(INTERACTIONS, "2026-03-08", INTERACTIONS_SCHEMA))
    message = str(error.value)
    assert message.startswith(f"{file} (dataset '{INTERACTIONS}', date 2026-03-08): column 'ts'")
    assert "2026-03-08 02:30:00" in message and f"do not exist in {NEW_YORK}" in message


def test_a_repeated_hour_reads_as_the_earlier_instant() -> None:
    naive = pa.array([dt.datetime(2026, 11, 1, 1, 30), None], pa.timestamp("us"))
    target = pa.schema([("ts", pa.timestamp("us", tz="UTC"))])
    batch = localize(pa.record_batch([naive], names=["ts"]), target, NEW_YORK).cast(target)
    # 01:30 happens twice in New York that night: first in summer time (UTC-4).
    assert batch["ts"].to_pylist() == [dt.datetime(2026, 11, 1, 5, 30, tzinfo=dt.UTC), None]
    with pytest.raises(NonexistentTimeError, match="column 'ts' holds 1 wall-clock time"):
        skipped = pa.array([dt.datetime(2026, 3, 8, 2, 30)], pa.timestamp("us"))
        localize(pa.record_batch([skipped], names=["ts"]), target, NEW_YORK)


@pytest.mark.parametrize(
    ("spec", "default", "per_dataset"),
    [
        (None, None, {}),
        ("", None, {}),
        (NEW_YORK, NEW_YORK, {}),
        (
            "transactions=America/New_York, documents=Europe/Paris",
            None,
            {"transactions": NEW_YORK, "documents": "Europe/Paris"},
        ),
        ("UTC,documents=Europe/Paris", "UTC", {"documents": "Europe/Paris"}),
    ],
)
def test_landing_timezone_settings_parse(spec, default, per_dataset) -> None:
    zones = LandingTimezones.parse(spec)
    assert (zones.default, zones.per_dataset) == (default, per_dataset)
    assert zones.for_dataset("interactions") == default


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("America/Nowhere", "unknown time zone 'America/Nowhere'"),
        ("transactions=Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
        ("UTC,Europe/Paris", "two zones for every dataset"),
    ],
)
def test_a_bad_landing_timezone_fails_when_the_code_location_loads(
    monkeypatch, spec, words
) -> None:
    monkeypatch.setenv("NIGHTSHIFT_LANDING_TIMEZONE", spec)
    for env in ("local", "aws"):
        with pytest.raises(ValueError, match="NIGHTSHIFT_LANDING_TIMEZONE") as error:
            build_resources(env)
        assert words in str(error.value)


def test_the_landing_timezone_variable_reaches_every_environment(monkeypatch) -> None:
    monkeypatch.setenv("NIGHTSHIFT_LANDING_TIMEZONE", f"documents={NEW_YORK}")
    for env in ("local", "aws"):
        assert build_resources(env)["storage"].landing_timezone == f"documents={NEW_YORK}"
