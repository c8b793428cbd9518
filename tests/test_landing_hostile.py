"""A landing day as a careless or hostile writer leaves it: links that loop, dangle or leave the
data root, stray copies, byte-identical duplicates, Spark decimals, pandas categoricals and
invisible text; each is refused naming the file, or read once and counted."""

from __future__ import annotations

import decimal
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize
from documents_world import land_documents
from helpers import asset_metadata
from test_landing_files import DATE, SCHEMA, _put, _table

from assets.documents.assets import documents
from assets.documents.schemas import DOCUMENTS_SCHEMA
from assets.fraud.assets import transactions
from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import TRANSACTIONS, TRANSACTIONS_SCHEMA
from inference.engine.quarantine import blank
from inference.text.summary_figures import document_text
from resources.storage import DataStore, LandingDataError

# The day land_documents publishes its documents in.
DOCS_DAY = "2026-03-02"
ZERO_WIDTH_ONLY = " \u200b\u200c\u200d\u2060\ufeff\u3000 "


def _folder(store: DataStore) -> Path:
    return Path(store.landing_path("tx", DATE))


def _skipping(store: DataStore) -> DataStore:
    return DataStore(store.root, landing_not_parquet="skip")


def test_a_symlink_loop_fails_the_day_naming_it_and_nothing_is_read_twice(
    store: DataStore,
) -> None:
    _put(store, "part-00000.parquet", _table(10))
    folder = _folder(store)
    (folder / "sub").mkdir()
    (folder / "loop").symlink_to(f"../date={DATE}")
    (folder / "sub" / "up").symlink_to("..")  # two loops: followed, they would multiply
    (folder / "self").symlink_to("self")  # a link to itself: the OS says ELOOP
    (folder / "dataset").symlink_to("..")  # above the day: it holds the day, and the others

    for read in (_skipping(store), store):
        with pytest.raises(LandingDataError) as error:
            read.count_landing("tx", DATE, SCHEMA)
        message = str(error.value)
        for link in ("loop", "sub/up", "self", "dataset"):
            assert f"{folder / link} (a symlink loop" in message, message
    assert store.landing_dates("tx") == [DATE]
    # Mended, the day is read once.
    for link in ("loop", "sub/up", "self", "dataset"):
        (folder / link).unlink()
    assert store.count_landing("tx", DATE, SCHEMA) == 10


def test_a_dangling_link_fails_the_day_naming_it(store: DataStore) -> None:
    _put(store, "part-00000.parquet", _table(10))
    folder = _folder(store)
    (folder / "part-00001.parquet").symlink_to("/nowhere/part-00001.parquet")
    before = store.landing_fingerprint("tx", DATE)
    for read in (store, _skipping(store)):
        with pytest.raises(LandingDataError, match="landing link") as error:
            read.count_landing("tx", DATE, SCHEMA)
        assert (
            f"{folder / 'part-00001.parquet'} (a dangling link (-> /nowhere/part-00001.parquet"
            in str(error.value)
        )
    (folder / "part-00001.parquet").unlink()
    assert store.landing_fingerprint("tx", DATE) != before  # the sensor sees it mended


def test_a_link_outside_the_data_root_fails_and_one_inside_is_read(
    store: DataStore, tmp_path: Path
) -> None:
    _put(store, "part-00000.parquet", _table(10))
    folder = _folder(store)
    outside = tmp_path / "elsewhere.parquet"
    pq.write_table(_table(5, 100), outside)
    (folder / "part-00001.parquet").symlink_to(outside)
    with pytest.raises(LandingDataError) as error:
        store.count_landing("tx", DATE, SCHEMA)
    assert f"{folder / 'part-00001.parquet'} (a link to {outside}, outside the data root" in str(
        error.value
    )
    # A link to a file elsewhere inside the root is data like any other.
    (folder / "part-00001.parquet").unlink()
    shared = Path(store.path("shared"))
    shared.mkdir()
    pq.write_table(_table(5, 100), shared / "extra.parquet")
    (folder / "part-00001.parquet").symlink_to(shared / "extra.parquet")
    assert store.count_landing("tx", DATE, SCHEMA) == 15


def test_stray_copies_are_skipped_and_counted(store: DataStore) -> None:
    data = _put(store, "part-00000.parquet", _table(10))
    folder = _folder(store)
    strays = ["part-00000.parquet.tmp", "x.parquet._COPYING_", "part-00000.parquet.crc"]
    strays += ["part-00000.parquet.tmp-1a2b3c4d", "_SUCCESS"]
    for name in strays:
        shutil.copyfile(data, folder / name)
    listing = store.landing_listing("tx", DATE)
    assert listing.paths == [data]
    assert listing.skipped == sorted(str(folder / name) for name in strays)
    assert store.count_landing("tx", DATE, SCHEMA) == 10


def test_a_byte_identical_copy_fails_naming_both_or_is_skipped_and_counted(
    store: DataStore,
) -> None:
    data = _put(store, "part-00000.parquet", _table(10))
    _put(store, "part-00001.parquet", _table(10, 100))  # the same size, other bytes
    copy = str(_folder(store) / "part-00000 (1).parquet")
    shutil.copyfile(data, copy)
    link = str(_folder(store) / "part-00002.parquet")
    os.symlink(data, link)

    with pytest.raises(LandingDataError, match="landing file") as error:
        store.count_landing("tx", DATE, SCHEMA)
    message = str(error.value)
    assert f"{copy} repeats {data}" in message and f"{link} repeats {data}" in message, message
    assert "NIGHTSHIFT_LANDING_NOT_PARQUET=skip" in message

    skipping = _skipping(store)
    listing = skipping.landing_listing("tx", DATE)
    assert listing.duplicates == {copy: data, link: data}
    assert sorted(listing.skipped) == sorted([copy, link])
    assert skipping.count_landing("tx", DATE, SCHEMA) == 20


def test_a_spark_decimal_is_read_as_the_contracts_float_and_recorded(store: DataStore) -> None:
    contract = pa.schema([("id", pa.string()), ("amount", pa.float64())])
    amounts = [decimal.Decimal("12.34"), decimal.Decimal("999999999999.99")]
    landed = pa.table({"id": ["a", "b"], "amount": pa.array(amounts, pa.decimal128(18, 2))})
    _put(store, "part-00000.parquet", landed)

    assert store.read_landing("tx", DATE, contract)["amount"].to_pylist() == [
        12.34,
        999999999999.99,
    ]
    assert store.landing_casts("tx", DATE, contract) == {"amount: decimal128(18, 2) -> double": 1}
    # A contract no cast of the reader fits names the cast the writer would make.
    integral = pa.schema([("id", pa.string()), ("amount", pa.int64())])
    with pytest.raises(LandingDataError, match=r"cast amount from decimal128\(18, 2\) to int64"):
        store.count_landing("tx", DATE, integral)


@pytest.mark.parametrize("kept", [True, False], ids=["kept-for-the-next-pass", "streamed"])
def test_a_decimal_reads_as_the_nearest_float_with_its_exact_text_where_asked(
    store: DataStore, kept: bool, monkeypatch
) -> None:
    """Each decimal reads as the float its text parses to (Arrow's own cast misses it for about
    one value in seven), and ``exact`` keeps the text beside it: null for a file of floats."""
    contract = pa.schema([("id", pa.string()), ("amount", pa.float64())])
    amounts = [decimal.Decimal(c).scaleb(-2) for c in range(-5_000, 5_000, 7)]
    amounts += [decimal.Decimal("1234567890123456.78"), None]  # past 2^53 cents; a null
    ids = [f"d{i}" for i in range(len(amounts))]
    _put(
        store,
        "part-00000.parquet",
        pa.table({"id": ids, "amount": pa.array(amounts, pa.decimal128(18, 2))}),
    )
    _put(store, "part-00001.parquet", pa.table({"id": ["f0", "f1"], "amount": [0.1, 2.5]}))
    floats = [None if a is None else float(a) for a in amounts] + [0.1, 2.5]
    texts = [None if a is None else str(a) for a in amounts] + [None, None]

    if not kept:  # as a day of large files is read: never kept, every pass decodes
        monkeypatch.setattr("resources.landing_cache.THREADED_ROWS", 0)
    # Kept, the first read is recorded and the second served from it: both are checked.
    for _ in range(2):
        read = pa.Table.from_batches(
            store.iter_landing("tx", DATE, contract, columns=["id", "amount"], exact=["amount"])
        )
        assert read.column_names == ["id", "amount", "amount_exact"]
        assert read["amount"].to_pylist() == floats
        assert read["amount_exact"].to_pylist() == texts
    assert store.read_landing("tx", DATE, contract)["amount"].to_pylist() == floats
    with pytest.raises(ValueError, match=r"exact columns \['id'\]"):
        next(store.iter_landing("tx", DATE, contract, exact=["id"]))


def test_a_pandas_categorical_is_read_as_its_values(store: DataStore) -> None:
    landed = _table(4).set_column(0, "id", pa.array(["a", "b", "a", "c"]).dictionary_encode())
    _put(store, "part-00000.parquet", landed)
    assert pq.read_schema(f"{_folder(store)}/part-00000.parquet").field("id").type == (
        pa.dictionary(pa.int32(), pa.string())
    )
    assert store.read_landing("tx", DATE, SCHEMA)["id"].to_pylist() == ["a", "b", "a", "c"]
    assert store.landing_casts("tx", DATE, SCHEMA) == {
        "id: dictionary<values=string, indices=int32, ordered=0> -> string": 1
    }


def test_zero_width_text_is_blank() -> None:
    texts = pa.array(["body", ZERO_WIDTH_ONLY, "\ufeffbody", None])
    assert blank(texts).tolist() == [False, True, False, True]
    assert document_text("Title", ZERO_WIDTH_ONLY) == "Title"


# Through the landing assets: what the run records.


def test_a_day_of_stray_copies_and_decimal_amounts_lands_with_them_counted(
    store: DataStore, resources: dict, instance: DagsterInstance
) -> None:
    generate_day(store, DATE, scale=0.02)
    folder = Path(store.landing_path(TRANSACTIONS, DATE))
    table = pq.read_table(folder / "part-00000.parquet")
    index = table.schema.get_field_index("amount")
    spark = table.set_column(index, "amount", table["amount"].cast(pa.decimal128(18, 2)))
    pq.write_table(spark, folder / "part-00000.parquet")
    for name in ("part-00000.parquet.tmp", "part-00000.parquet._COPYING_", "_SUCCESS"):
        shutil.copyfile(folder / "part-00000.parquet", folder / name)

    result = materialize([transactions], partition_key=DATE, resources=resources, instance=instance)
    landed = asset_metadata(result, TRANSACTIONS)
    assert landed["dagster/row_count"] == table.num_rows
    assert landed["landing_files_skipped"] == 3
    assert landed["landing_casts"] == {"amount: decimal128(18, 2) -> double": 1}
    read = store.read_landing(TRANSACTIONS, DATE, TRANSACTIONS_SCHEMA)
    assert read["amount"].to_pylist() == pytest.approx(table["amount"].to_pylist(), abs=0.005)


def test_a_document_of_only_zero_width_text_is_quarantined_as_empty(
    store: DataStore, resources: dict, instance: DagsterInstance
) -> None:
    bodies = {f"real-{i}": f"The harbour strike ended on day {i}." for i in range(4)}
    land_documents(store, DOCS_DAY, {**bodies, "ghost": "\u200b"})
    day = store.read_landing("documents", DOCS_DAY, DOCUMENTS_SCHEMA)
    titles = pa.array([*day["title"].to_pylist()[:4], ZERO_WIDTH_ONLY])
    store.write_landing("documents", DOCS_DAY, day.set_column(2, "title", titles))

    result = materialize(
        [documents],
        partition_key=DOCS_DAY,
        resources=resources,
        instance=instance,
        run_config={"ops": {"documents": {"config": {"max_quarantine_rate": 0.3}}}},
    )
    assert asset_metadata(result, "documents")["quarantine_reasons"] == {"empty_text": 1}


def test_demo_days_land_on_time_however_late_they_were_generated(
    store: DataStore, resources: dict, instance: DagsterInstance
) -> None:
    """Generated days are dated as an export that landed on time (the demo in the UI showed
    every recent day late: generated hours after it ended), and pass their deadline check."""
    import datetime as dt

    from assets.gates import landed_hours_after_day_end

    today = dt.datetime.now(dt.UTC).date()
    days = [str(today - dt.timedelta(days=n)) for n in (3, 1)]
    for day in days:
        generate_day(store, day, scale=0.01)
        assert landed_hours_after_day_end(store, TRANSACTIONS, day) == pytest.approx(0.5, abs=1e-3)
    result = materialize(
        [transactions], partition_key=days[0], resources=resources, instance=instance
    )
    [on_time] = [
        c
        for c in result.get_asset_check_evaluations()
        if c.check_name == "transactions_landed_on_time"
    ]
    assert on_time.passed, on_time.metadata
    # Today's day is not over: it is dated now, and counts as landed before its end.
    generate_day(store, str(today), scale=0.01)
    assert landed_hours_after_day_end(store, TRANSACTIONS, str(today)) < 0


def test_a_late_day_says_how_late_in_its_check_description(
    store: DataStore, resources: dict, instance: DagsterInstance
) -> None:
    """The on-time check's page says why it failed in a sentence (issue 44: the reason was only
    a raw expectation table behind "[Show Markdown]")."""
    import datetime as dt
    import os

    from assets.gates import landed_hours_after_day_end
    from policy.partitions import day_end

    day = str(dt.datetime.now(dt.UTC).date() - dt.timedelta(days=2))
    generate_day(store, day, scale=0.01)
    landed = day_end(day).timestamp() + 18.4 * 3600
    for path in store.landing_files(TRANSACTIONS, day):
        os.utime(path, (landed, landed))
    assert landed_hours_after_day_end(store, TRANSACTIONS, day) == pytest.approx(18.4)

    result = materialize([transactions], partition_key=day, resources=resources, instance=instance)
    [on_time] = [
        c
        for c in result.get_asset_check_evaluations()
        if c.check_name == "transactions_landed_on_time"
    ]
    assert not on_time.passed
    reason = f"{day}: hours_after_day_end is [18.4], allowed max_value=2.0"
    assert on_time.description.startswith(f"Failed: {reason}"), on_time.description
    assert on_time.metadata["failed_because"].value.startswith(reason)
