"""A day's shard files become its table's data files as they are: no row is read or written
again to stage or publish it, on a local root and on S3, and every reader still sees the day."""

from __future__ import annotations

import os
import time
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import ArrowScan
from table_reader import duckdb_connection

from inference.engine.output_partition import PartitionIO
from inference.engine.shard_writer import ShardedWriter, ShardFileTargets, stage_shard_files
from resources.storage import DataStore

DAY = "2026-03-01"
SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64()), ("v", pa.list_(pa.float32(), 3))])


def _rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n)
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 3), pa.float32()), 3)
    return pa.table({"id": ids, "y": ids * 2.0, "v": vectors}, schema=SCHEMA)


def _commit_day(store: DataStore, shards: int, rows: int, fp: str) -> ShardedWriter:
    """A day written shard by shard and committed by the engine's writer."""
    writer = ShardedWriter(
        ShardFileTargets(store.partition_target("out", DAY), SCHEMA), fp, rows, f"run-{fp}"
    )
    writer.begin()
    try:
        for shard in range(shards):
            writer.write_shard(shard, [_rows(shard * rows, rows)], rows_in=rows)
        writer.commit(shards)
    finally:
        writer.close()
    return writer


def _no_row_reads():
    """Fails anything that reads a table's rows through pyiceberg while it is active."""

    def refused(*args, **kwargs):
        raise AssertionError("the commit read rows")

    return patch.multiple(ArrowScan, to_table=refused, to_record_batches=refused)


def test_a_days_shard_files_are_its_data_files_and_a_rerun_replaces_them(
    any_store: DataStore,
) -> None:
    with _no_row_reads():
        first = _commit_day(any_store, shards=3, rows=40, fp="a")
    commit = first.report.commit
    files = any_store.output_files("out", DAY)
    # One data file per shard, under the commit's name, holding the shard's own columns: the
    # day is in the file's partition record, not written into it.
    assert [f.rsplit("/", 1)[1] for f in files] == [
        f"{commit}-shard-0000{i}.parquet" for i in range(3)
    ]
    assert all(f.split("/")[-2] == f"date={DAY}" for f in files)
    assert pq.read_schema(files[0], filesystem=any_store.fs).names == SCHEMA.names
    # Staging is gone and the data files stay.
    assert not any_store.exists(any_store.path("outputs", "out", "_staging", f"date={DAY}"))
    expected = pa.concat_tables([_rows(i * 40, 40) for i in range(3)])
    assert any_store.read_output("out", DAY).equals(expected)

    with _no_row_reads():
        second = _commit_day(any_store, shards=2, rows=50, fp="b")
    assert any_store.output_commit("out", DAY) == second.report.commit
    day = any_store.read_output("out", DAY)
    assert day.equals(pa.concat_tables([_rows(i * 50, 50) for i in range(2)]))
    # pyiceberg's own filter on the day (the value comes from the partition record) agrees.
    from pyiceberg.expressions import EqualTo

    table = any_store.tables.load("out")
    scanned = table.scan(row_filter=EqualTo("date", DAY)).to_arrow()
    assert scanned.num_rows == 100 and set(scanned["date"].to_pylist()) == {
        np.datetime64(DAY).astype(object)
    }


def test_duckdb_reads_the_day_of_registered_files(any_store: DataStore) -> None:
    store = any_store
    _commit_day(store, shards=2, rows=30, fp="a")
    _commit_day(store, shards=3, rows=20, fp="b")
    location = store.tables.load("out").metadata_location
    location = location.split("://", 1)[1] if location.startswith("file://") else location
    con = duckdb_connection(store.catalog_props)
    rows = con.execute(
        "select count(*), count(distinct id), min(date), max(date) from iceberg_scan(?) "
        "where date = ?::date",
        [location, DAY],
    ).fetchone()
    assert rows[:2] == (60, 60) and str(rows[2]) == str(rows[3]) == DAY
    vector = con.execute("select v from iceberg_scan(?) where id = 7", [location]).fetchone()[0]
    assert vector == [7.0, 7.0, 7.0]


def test_a_file_in_other_columns_or_without_field_ids_is_written_again_through_the_table(
    store: DataStore,
) -> None:
    """Only a file in the table's columns and field ids is registered as it is. A companion's
    shards may disagree on a column's type (inferred from its rows), and a file written
    without the table's field ids would be read by name alone (a strict catalog refuses it):
    each is rewritten in the table's own files."""
    target = store.partition_target("out", DAY)
    staging = Path(target.staging_dir)
    staging.mkdir(parents=True)
    ids = store.tables.file_schema("out", SCHEMA)
    assert [f.metadata[b"PARQUET:field_id"] for f in ids] == [b"1", b"2", b"3"]
    pq.write_table(_rows(0, 5).cast(ids), staging / "shard-00000.parquet")
    narrow = _rows(5, 5).set_column(0, "id", pa.array(range(5, 10), pa.int32()))
    pq.write_table(
        narrow.cast(ids.set(0, pa.field("id", pa.int32()))), staging / "shard-00001.parquet"
    )
    pq.write_table(_rows(10, 5), staging / "shard-00002.parquet")  # no field ids
    figures = {"commit": "c1", "rows": 15}
    names = ["shard-00000.parquet", "shard-00001.parquet", "shard-00002.parquet"]
    staged = stage_shard_files(PartitionIO(target), target, str(staging), names, SCHEMA, figures)
    store.tables.publish("out", DAY, staged)
    files = store.output_files("out", DAY)
    assert files[0].endswith("/c1-shard-00000.parquet")  # registered as it is
    assert not any(
        f.endswith(("/c1-shard-00001.parquet", "/c1-shard-00002.parquet")) for f in files[1:]
    )
    assert len(files) == 3
    assert store.read_output("out", DAY).equals(_rows(0, 15))


def test_a_linked_file_is_new_to_upkeep_however_old_its_shard(store: DataStore) -> None:
    """Upkeep deletes unreferenced files older than the retention: a shard written long ago
    and linked into the table just now must not look like one in the moment before its
    commit references it."""
    target = store.partition_target("out", DAY)
    staging = Path(target.staging_dir)
    staging.mkdir(parents=True)
    shard = staging / "shard-00000.parquet"
    pq.write_table(_rows(0, 5), shard)
    old = time.time() - 90 * 86400
    os.utime(shard, (old, old))
    placed = PartitionIO(target).link(str(shard), f"{target.final_dir}/c1-shard-00000.parquet")
    assert placed == f"file://{target.final_dir}/c1-shard-00000.parquet"
    assert time.time() - os.stat(f"{target.final_dir}/c1-shard-00000.parquet").st_mtime < 60


def test_an_empty_day_replaces_a_day_of_rows(store: DataStore) -> None:
    _commit_day(store, shards=1, rows=40, fp="a")
    writer = ShardedWriter(
        ShardFileTargets(store.partition_target("out", DAY), SCHEMA), "empty", 0, "run-empty"
    )
    writer.begin()
    try:
        writer.write_shard(0, [], rows_in=0)
        writer.commit(1)
    finally:
        writer.close()
    assert store.output_exists("out", DAY)
    assert store.read_output("out", DAY).num_rows == 0
    assert store.output_commit("out", DAY) == writer.report.commit


def test_replaced_days_leave_main_and_upkeep_takes_their_files(store: DataStore) -> None:
    """Main's metadata does not grow with the days it replaced (no manifest of deletions is
    carried from commit to commit), so upkeep sees the replaced files go."""
    import datetime as dt

    from inference.engine.table_upkeep import upkeep

    for run in range(4):
        _commit_day(store, shards=2, rows=10, fp=f"run{run}")
    table = store.tables.load("out")
    assert len(table.current_snapshot().manifests(table.io)) == 1
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=31)
    upkeep(store.tables, "out", dt.timedelta(days=30), later, store.fs)
    on_disk = sorted(str(p) for p in Path(store.path("outputs", "out", "data")).rglob("*.parquet"))
    assert on_disk == sorted(store.output_files("out", DAY))
    assert store.read_output("out", DAY).equals(pa.concat_tables([_rows(0, 10), _rows(10, 10)]))
