"""Every file below a landing partition is read as parquet (by its bytes) or named and counted as
skipped; a file that is not parquet fails the day unless the skip policy is set."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize
from fraud_world import trained_fraud_world
from helpers import asset_metadata

from assets.fraud.assets import fraud_scores, transactions
from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import TRANSACTIONS, TRANSACTIONS_SCHEMA
from resources.landing_files import looks_like
from resources.storage import DataStore, LandingDataError, StorageResource

SCHEMA = pa.schema([("id", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
DATE = "2026-03-01"


def _table(n: int, start: int = 0) -> pa.Table:
    ts = [dt.datetime(2026, 3, 1, tzinfo=dt.UTC)] * n
    return pa.table({"id": [f"t{i}" for i in range(start, start + n)], "ts": ts}, schema=SCHEMA)


def _put(store: DataStore, name: str, data: bytes | pa.Table) -> str:
    path = f"{store.landing_path('tx', DATE)}/{name}"
    store.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    if isinstance(data, pa.Table):
        pq.write_table(data, path, filesystem=store.fs)
    else:
        with store.fs.open_output_stream(path) as out:
            out.write(data)
    return path


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"transaction_id,amount,ts\ntx-1,12.5,2026-03-01\ntx-2,3.0,2026-03-01\n", "CSV text"),
        (b'{"files": ["part-00000.parquet"], "rows": 10}', "JSON,"),
        (b'{"id": 1}\n{"id": 2}\n', "JSON lines"),
        (b"\x1f\x8b\x08\x00rest", "gzip"),
        (b"ORC\x0a\x03", "ORC"),
        (b"just a note about this folder", "plain text"),
        (b"\x00\x01\x02\xff\xfe", "binary data"),
        (b"", "empty file"),
    ],
)
def test_what_a_file_that_is_not_parquet_looks_like(head: bytes, expected: str) -> None:
    assert expected in looks_like(head, len(head))


def test_every_file_is_read_skipped_or_failed_by_the_same_listing(any_store: DataStore) -> None:
    store = any_store
    parquet = {"000000_0": 30, "x.parq": 20, "Y.PARQUET": 10, "part-00000.parquet": 0}
    for i, (name, rows) in enumerate(parquet.items()):
        _put(store, name, _table(rows, 100 * i))
    csv = _put(store, "part-00001.csv", b"id,ts\nt900,2026-03-01\nt901,2026-03-01\n")
    manifest = _put(store, "manifest.json", json.dumps({"rows": 60}).encode())
    hive = [_put(store, "_SUCCESS", b""), _put(store, ".000000_0.crc", b"crc")]

    # The default policy: the day fails naming each foreign file and what it looks like, and
    # every reader refuses it alike.
    for read in (
        lambda: store.count_landing("tx", DATE, SCHEMA),
        lambda: store.landing_files("tx", DATE),
        lambda: list(store.iter_landing("tx", DATE, SCHEMA)),
    ):
        with pytest.raises(LandingDataError) as error:
            read()
        message = str(error.value)
        assert f"{store.uri(csv)} (looks like CSV text" in message, message
        assert f"{store.uri(manifest)} (looks like JSON" in message, message
        assert "NIGHTSHIFT_LANDING_NOT_PARQUET=skip" in message and DATE in message
    assert store.landing_dates("tx") == [DATE]
    failing = store.landing_fingerprint("tx", DATE)

    # Skip: the same files are read by every path, the rest counted.
    skipping = DataStore(store.root, store.s3_endpoint, store.s3_region, landing_not_parquet="skip")
    listing = skipping.landing_listing("tx", DATE)
    folder = skipping.landing_path("tx", DATE)
    assert [p[len(folder) + 1 :] for p in listing.paths] == sorted(parquet)
    assert listing.skipped == sorted([csv, manifest, *hive])
    assert set(listing.not_parquet) == {csv, manifest}
    assert skipping.landing_files("tx", DATE) == listing.paths
    assert skipping.count_landing("tx", DATE, SCHEMA) == 60
    ids = skipping.read_landing("tx", DATE, SCHEMA).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 60
    assert sum(b.num_rows for b in skipping.iter_landing("tx", DATE, SCHEMA)) == 60
    assert skipping.landing_dates("tx") == [DATE]

    # Removing the file that failed the day changes the fingerprint (the sensor relaunches it).
    store.fs.delete_file(manifest)
    store.fs.delete_file(csv)
    assert store.landing_fingerprint("tx", DATE) not in (failing, None)
    assert store.count_landing("tx", DATE, SCHEMA) == 60


def test_a_date_of_only_foreign_files_is_a_failing_day_unless_skipped(
    any_store: DataStore,
) -> None:
    _put(any_store, "export.csv", b"id,ts\nt1,2026-03-01\n")
    assert any_store.landing_dates("tx") == [DATE]
    assert any_store.landing_fingerprint("tx", DATE) is not None
    skipping = DataStore(
        any_store.root, any_store.s3_endpoint, any_store.s3_region, landing_not_parquet="skip"
    )
    assert skipping.landing_dates("tx") == []
    assert skipping.landing_fingerprint("tx", DATE) is None
    with pytest.raises(LandingDataError, match=r"no parquet files .*export\.csv \(looks like CSV"):
        skipping.count_landing("tx", DATE, SCHEMA)


def test_a_file_named_parquet_that_is_not_says_what_it_looks_like(store: DataStore) -> None:
    _put(store, "part-00000.parquet", b"id,ts\nt1,2026-03-01\nt2,2026-03-01\n")
    with pytest.raises(LandingDataError, match=r"unreadable parquet file .*looks like CSV text"):
        store.count_landing("tx", DATE, SCHEMA)


def test_a_bad_policy_names_the_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NIGHTSHIFT_LANDING_NOT_PARQUET", "ignore")
    with pytest.raises(ValueError, match="NIGHTSHIFT_LANDING_NOT_PARQUET is 'ignore'"):
        DataStore(str(tmp_path / "data"))
    with pytest.raises(ValueError, match="landing_not_parquet is 'drop'"):
        DataStore(str(tmp_path / "data"), landing_not_parquet="drop")


# Through the pipeline: a day of 5,000 transactions landed in pieces beside a trained model.


@pytest.fixture(scope="module")
def fraud(tmp_path_factory) -> dict:
    world = trained_fraud_world(
        tmp_path_factory.mktemp("landing_files") / "data", "2026-04-01", 0.05
    )
    return {**world, "next_day": iter(range(2, 29))}


def _day(fraud: dict) -> tuple[str, pa.Table, Path]:
    """A fresh day (5,000 transactions): its date, its rows, and its emptied folder."""
    store, date = fraud["store"], f"2026-04-{next(fraud['next_day']):02d}"
    generate_day(store, date, scale=0.05)
    table = store.read_landing(TRANSACTIONS, date, TRANSACTIONS_SCHEMA)
    folder = Path(store.landing_path(TRANSACTIONS, date))
    (folder / "part-00000.parquet").unlink()
    return date, table, folder


def _run(fraud: dict, date: str, storage: StorageResource | None = None):
    resources = {**fraud["resources"], **({"storage": storage} if storage else {})}
    instance = DagsterInstance.ephemeral()
    result = materialize(
        [transactions, fraud_scores],
        partition_key=date,
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )
    logs = [e.user_message for e in instance.all_logs(result.run_id)]
    return result, logs


def _assert_conserved(fraud: dict, result, date: str, landed: int) -> None:
    """Every landed row is published once: scored, or quarantined (from the published files)."""
    assert result.success
    store = fraud["store"]
    scores = store.read_output("fraud_scores", date)
    held = (
        store.read_output("fraud_scores_quarantine", date).num_rows
        if store.output_exists("fraud_scores_quarantine", date)
        else 0
    )
    assert landed == scores.num_rows + held
    assert len(pc.unique(scores["transaction_id"])) == scores.num_rows


def test_a_csv_beside_parquet_fails_the_day_or_is_skipped_and_counted(
    fraud: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    date, table, folder = _day(fraud)
    pq.write_table(table.slice(0, 4000), folder / "part-00000.parquet")
    pcsv.write_csv(table.slice(4000), folder / "part-00001.csv")

    result, _ = _run(fraud, date)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    message = failure.step_failure_data.error.message
    assert failure.step_key == "transactions"
    assert f"{folder / 'part-00001.csv'} (looks like CSV text" in message, message
    assert not fraud["store"].output_exists("fraud_scores", date)

    # The documented setting skips it: the day scores its 4,000 parquet rows, and the CSV is
    # counted and named.
    monkeypatch.setenv("NIGHTSHIFT_LANDING_NOT_PARQUET", "skip")
    result, logs = _run(fraud, date, StorageResource(data_root=str(fraud["root"])))
    _assert_conserved(fraud, result, date, 4000)
    source = asset_metadata(result, "transactions")
    assert source["dagster/row_count"] == 4000 and source["landing_files_skipped"] == 1
    named = [m for m in logs if "part-00001.csv (looks like CSV text" in m]
    assert named and "skipped 1 file(s) that are not parquet" in named[0], logs


def test_parquet_without_the_suffix_is_read(fraud: dict) -> None:
    date, table, folder = _day(fraud)
    pq.write_table(table.slice(0, 2000), folder / "000000_0")
    pq.write_table(table.slice(2000, 1500), folder / "x.parq")
    pq.write_table(table.slice(3500), folder / "Y.PARQUET")
    pq.write_table(table.slice(0, 0), folder / "part-00000.parquet")
    (folder / "_SUCCESS").write_bytes(b"")

    result, logs = _run(fraud, date)
    assert not any("landing partition empty" in m for m in logs)
    _assert_conserved(fraud, result, date, table.num_rows)
    source = asset_metadata(result, "transactions")
    assert source["dagster/row_count"] == table.num_rows == 5000
    assert source["landing_files_skipped"] == 1


def test_an_empty_day_names_the_files_it_read_and_skipped(fraud: dict) -> None:
    date, table, folder = _day(fraud)
    pq.write_table(table.slice(0, 0), folder / "part-00000.parquet")
    pcsv.write_csv(table, folder / "part-00001.csv")
    storage = StorageResource(data_root=str(fraud["root"]), landing_not_parquet="skip")
    result, _ = _run(fraud, date, storage)
    assert not result.success
    message = result.get_step_failure_events()[0].step_failure_data.error.message
    assert "landing partition empty" in message and date in message
    assert "1 parquet file(s) with no rows (part-00000.parquet)" in message, message
    assert "1 file(s) skipped, not read: part-00001.csv" in message, message
