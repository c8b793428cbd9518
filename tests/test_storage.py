"""Storage behind one interface, on a local folder and on a local S3-compatible server."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from resources import datastore, landing_cache
from resources.storage import DataStore, LandingDataError

SCHEMA = pa.schema(
    [("id", pa.string()), ("amount", pa.float64()), ("ts", pa.timestamp("us", tz="UTC"))]
)


def _table(n: int, start: int = 0) -> pa.Table:
    ts = [dt.datetime(2026, 3, 1, tzinfo=dt.UTC)] * n
    return pa.table(
        {
            "id": [f"t{i}" for i in range(start, start + n)],
            "amount": [float(i) for i in range(n)],
            "ts": ts,
        },
        schema=SCHEMA,
    )


def test_landing_round_trip_and_stream(any_store: DataStore) -> None:
    any_store.write_landing("tx", "2026-03-01", _table(1000))
    assert any_store.landing_dates("tx") == ["2026-03-01"]
    assert any_store.count_landing("tx", "2026-03-01", SCHEMA) == 1000
    batches = list(any_store.iter_landing("tx", "2026-03-01", SCHEMA, batch_size=300))
    assert sum(b.num_rows for b in batches) == 1000 and max(b.num_rows for b in batches) <= 300


def test_missing_partition_names_dataset_date_and_path(any_store: DataStore) -> None:
    with pytest.raises(LandingDataError) as err:
        any_store.count_landing("tx", "2026-03-02", SCHEMA)
    message = str(err.value)
    assert "'tx'" in message and "2026-03-02" in message and "landing/tx/date=2026-03-02" in message


def test_missing_column_and_wrong_type_name_file_and_column(any_store: DataStore) -> None:
    any_store.write_landing("tx", "2026-03-01", _table(5).drop_columns(["amount"]))
    with pytest.raises(LandingDataError, match=r"part-00000\.parquet.*'amount'.*missing"):
        any_store.count_landing("tx", "2026-03-01", SCHEMA)
    bad = _table(5).set_column(1, "amount", pa.array(["x"] * 5))
    any_store.write_landing("tx", "2026-03-01", bad)
    with pytest.raises(LandingDataError, match=r"part-00000\.parquet.*'amount' has type string"):
        any_store.count_landing("tx", "2026-03-01", SCHEMA)


def test_publish_replaces_a_partition_instead_of_appending(any_store: DataStore) -> None:
    first = any_store.publish("scores", "2026-03-01", [_table(10)], SCHEMA)
    again = any_store.publish("scores", "2026-03-01", iter(_table(7, 100).to_batches()), SCHEMA)
    assert (first.rows, again.rows) == (10, 7)
    out = any_store.read_output("scores", "2026-03-01")
    assert out.num_rows == 7 and out.column("id")[0].as_py() == "t100"


def test_failed_publish_keeps_the_previous_output(any_store: DataStore) -> None:
    any_store.publish("scores", "2026-03-01", [_table(10)], SCHEMA)

    def failing():
        yield _table(3)
        raise RuntimeError("model crashed mid-partition")

    with pytest.raises(RuntimeError, match="mid-partition"):
        any_store.publish("scores", "2026-03-01", failing(), SCHEMA)
    assert any_store.read_output("scores", "2026-03-01").num_rows == 10


def test_unreadable_file_names_the_file(store: DataStore) -> None:
    path = store.landing_path("tx", "2026-03-01")
    store.fs.create_dir(path, recursive=True)
    with open(f"{path}/part-00000.parquet", "wb") as f:
        f.write(b"PAR1 not really parquet")
    with pytest.raises(LandingDataError, match=r"unreadable parquet file .*part-00000\.parquet"):
        store.count_landing("tx", "2026-03-01", SCHEMA)


def test_narrower_integer_types_are_accepted(store: DataStore) -> None:
    path = store.landing_path("n", "2026-03-01")
    store.fs.create_dir(path, recursive=True)
    pq.write_table(pa.table({"n": pa.array([1, 2], pa.int32())}), f"{path}/a.parquet")
    table = store.read_landing("n", "2026-03-01", pa.schema([("n", pa.int64())]))
    assert table.column("n").type == pa.int64() and table.num_rows == 2


def test_names_starting_with_underscore_or_dot_are_not_data(any_store: DataStore) -> None:
    any_store.write_landing("tx", "2026-03-01", _table(10))
    path = any_store.landing_path("tx", "2026-03-01")
    not_data = [
        f"{path}/_temporary/0/task_0/part-00000.parquet",
        f"{path}/.part-00000.parquet.crc",
        f"{path}/_SUCCESS",
        f"{path}/_committed_1234",
    ]
    any_store.fs.create_dir(f"{path}/_temporary/0/task_0", recursive=True)
    pq.write_table(_table(4), not_data[0], filesystem=any_store.fs)
    for name in not_data[1:]:
        with any_store.fs.open_output_stream(name) as out:
            out.write(b"x")
    # A date whose only file is an unfinished write is not a partition yet.
    pending = any_store.landing_path("tx", "2026-03-02")
    any_store.fs.create_dir(f"{pending}/_temporary/0", recursive=True)
    pq.write_table(_table(4), f"{pending}/_temporary/0/part-00000.parquet", filesystem=any_store.fs)

    assert any_store.landing_files("tx", "2026-03-01") == [f"{path}/part-00000.parquet"]
    assert any_store.landing_listing("tx", "2026-03-01").skipped == sorted(not_data)
    assert any_store.count_landing("tx", "2026-03-01", SCHEMA) == 10
    assert sum(b.num_rows for b in any_store.iter_landing("tx", "2026-03-01", SCHEMA)) == 10
    assert any_store.landing_dates("tx") == ["2026-03-01"]
    with pytest.raises(LandingDataError, match=r"no parquet files .*1 not-data file\(s\) skipped"):
        any_store.count_landing("tx", "2026-03-02", SCHEMA)


@pytest.mark.parametrize("footers_kept", [2048, 3], ids=["footers kept", "footers re-read"])
def test_small_files_stream_in_order_in_joined_batches(
    store: DataStore, footers_kept: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(landing_cache, "FOOTERS_KEPT", footers_kept)
    monkeypatch.setattr(landing_cache, "FOOTER_CHUNK", 7)
    path = store.landing_path("tx", "2026-03-01")
    store.fs.create_dir(path, recursive=True)
    for i in range(40):  # 40 files of 25 rows, then one large file
        pq.write_table(_table(25, 25 * i), f"{path}/part-{i:05d}.parquet")
    pq.write_table(_table(40_000, 1000), f"{path}/part-99999.parquet", row_group_size=40_000)
    batches = list(store.iter_landing("tx", "2026-03-01", SCHEMA, batch_size=300))
    ids = [i for b in batches for i in b["id"].to_pylist()]
    assert ids == [f"t{i}" for i in range(41_000)]
    assert max(b.num_rows for b in batches) <= 300
    # The 1,000 small-file rows arrive in 4 batches, not 40.
    assert [b.num_rows for b in batches[:4]] == [300, 300, 300, 100]
    assert store.count_landing("tx", "2026-03-01", SCHEMA) == 41_000


def test_a_partition_of_small_files_is_decoded_once_per_store_until_a_file_changes(
    store: DataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = store.landing_path("tx", "2026-03-01")
    store.fs.create_dir(path, recursive=True)
    for i in range(30):
        pq.write_table(_table(20, 20 * i), f"{path}/part-{i:05d}.parquet")
    opened: list[str] = []
    read_files = datastore.iter_parquet_files

    def counting(files, *args, **kwargs):
        opened.extend(files)
        return read_files(files, *args, **kwargs)

    monkeypatch.setattr(datastore, "iter_parquet_files", counting)

    def ids(columns: list[str] | None = None) -> list[str]:
        batches = store.iter_landing("tx", "2026-03-01", SCHEMA, columns=columns, batch_size=64)
        return [i for b in batches for i in b["id"].to_pylist()]

    expected = [f"t{i}" for i in range(600)]
    assert ids() == expected
    assert ids(["id"]) == expected  # another pass, fewer columns: served from the first read
    assert len(opened) == 30
    # A file replaced (other size): every file is read afresh, and the new rows are seen.
    pq.write_table(_table(5, 1000), f"{path}/part-00029.parquet")
    assert ids() == expected[:580] + [f"t{i}" for i in range(1000, 1005)]
    assert len(opened) == 60
