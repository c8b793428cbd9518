"""The output tables through a real Iceberg REST catalog (tests/rest_world.py): a token from
pyiceberg's own configuration, a nested namespace, and table locations the server assigns, so
a day's shard files go under the table's location, wherever the catalog put it."""

from __future__ import annotations

import datetime as dt
import multiprocessing
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rest_world import NAMESPACE, RestCatalog
from test_table_commits import _commit_days
from test_table_files import DAY, _commit_day, _rows

from inference.engine.table_upkeep import upkeep
from inference.engine.tables import TableError
from resources.storage import DataStore


def _store(root: Path, catalog: RestCatalog) -> DataStore:
    return DataStore(str(root), **catalog.settings())


def test_a_day_through_a_rest_catalog_that_places_its_tables_itself(
    rest_client: RestCatalog, tmp_path
) -> None:
    store = _store(tmp_path / "data", rest_client)
    first = _commit_day(store, shards=3, rows=40, fp="a")

    table = store.tables.load("out")
    assert store.tables.identifier("out") == f"{NAMESPACE}.out"
    assert table.name() == ("gold", "nightshift", "out")
    location = Path(table.location().removeprefix("file://"))
    # The server chose the location (it refuses one), under its own storage root.
    assert location.is_relative_to(rest_client.warehouse), location
    files = store.output_files("out", DAY)
    assert [Path(f).parent for f in files] == [location / "data" / f"date={DAY}"] * 3
    assert [Path(f).name for f in files] == [
        f"{first.report.commit}-shard-0000{i}.parquet" for i in range(3)
    ]
    assert first.report.uri == str(location / "data" / f"date={DAY}")
    assert not (tmp_path / "data" / "outputs" / "out" / "data").exists()
    expected = pa.concat_tables([_rows(i * 40, 40) for i in range(3)])
    assert store.read_output("out", DAY).equals(expected)

    second = _commit_day(store, shards=2, rows=50, fp="b")
    assert store.output_commit("out", DAY) == second.report.commit
    assert [where for _, where in store.tables.history("out", DAY)] == ["current", "published"]
    store.tables.rollback("out", DAY)
    assert store.output_commit("out", DAY) == first.report.commit
    assert store.read_output("out", DAY).equals(expected)

    # Upkeep sweeps the table's own folder: a file no commit references goes, once old.
    stray = location / "data" / f"date={DAY}" / "left-by-a-crash.parquet"
    pq.write_table(_rows(0, 5), stray)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=31)
    done = upkeep(store.tables, "out", dt.timedelta(days=30), later, store.fs)
    assert not stray.exists() and done.files_deleted >= 1
    # Lakana expires snapshots itself and refuses ours: said, and the orphans still went.
    assert "lakana table maintain" in (done.refused or "")
    assert "refused to expire them" in done.describe(30)
    assert store.read_output("out", DAY).equals(expected)


def test_runs_committing_different_days_through_a_rest_catalog_all_land(
    rest_client: RestCatalog, tmp_path
) -> None:
    """Three processes (started with the catalog's settings in their environment, as a run
    is) commit their own days of one table at once; the server's conflicts are retried."""
    root = tmp_path / "data"
    settings = rest_client.settings()
    _commit_days(str(root), "2026-04-01", 1, settings)
    dates = ["2026-04-02", "2026-04-03", "2026-04-04"]
    context = multiprocessing.get_context("spawn")
    writers = [
        context.Process(target=_commit_days, args=(str(root), d, 6, settings)) for d in dates
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=300)
        assert writer.exitcode == 0
    store = _store(root, rest_client)
    for date in dates:
        day = store.read_output("shared", date)
        assert day.num_rows == 100 and set(day["run"].to_pylist()) == {5}
        assert store.output_commit("shared", date) == f"{date}-5"
    assert store.read_output("shared", "2026-04-01").num_rows == 100


def test_a_rest_catalog_without_its_token_fails_naming_the_server_and_the_setting(
    rest_catalog: RestCatalog, tmp_path, monkeypatch
) -> None:
    from pyiceberg.utils.config import Config

    monkeypatch.setenv("PYICEBERG_CATALOG__NIGHTSHIFT__PREFIX", "dev")
    monkeypatch.delenv("PYICEBERG_CATALOG__NIGHTSHIFT__TOKEN", raising=False)
    monkeypatch.setattr("pyiceberg.catalog._ENV_CONFIG", Config())
    store = _store(tmp_path / "data", rest_catalog)
    with pytest.raises(TableError) as error:
        _commit_day(store, shards=1, rows=5, fp="a")
    message = str(error.value)
    assert rest_catalog.uri in message and "PYICEBERG_CATALOG__NIGHTSHIFT__TOKEN" in message
    assert "Authorization" in message  # the server's own words
