"""Alerts come from exactly what was scored, a published day holds only its own data files, and a full disk names the file it could not write and publishes nothing."""

from __future__ import annotations

import decimal
import os
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize
from fraud_world import trained_fraud_world
from helpers import asset_metadata

from assets.fraud.assets import fraud_alerts, fraud_scores, transactions
from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import FLAGGED, TRANSACTIONS, TRANSACTIONS_SCHEMA
from resources.storage import DataStore

FIRST_DAY = "2026-05-01"


@pytest.fixture(scope="module")
def fraud(tmp_path_factory) -> dict:
    """A data root with a trained fraud model; each test lands its own days beside it."""
    world = trained_fraud_world(tmp_path_factory.mktemp("alerts") / "data", FIRST_DAY, 0.02)
    return {**world, "days": iter(range(2, 29))}


def _day(fraud: dict) -> str:
    date = f"2026-05-{next(fraud['days']):02d}"
    generate_day(fraud["store"], date, scale=0.05, seed=int(date[-2:]))
    return date


def _run(fraud: dict, assets: list, date: str):
    with DagsterInstance.ephemeral() as instance:
        return materialize(
            assets,
            partition_key=date,
            resources=fraud["resources"],
            instance=instance,
            raise_on_error=False,
        )


def _by_id(table: pa.Table, column: str) -> dict:
    return dict(zip(table["transaction_id"].to_pylist(), table[column].to_pylist(), strict=True))


def _landing_file(store: DataStore, date: str) -> Path:
    (file,) = store.landing_files(TRANSACTIONS, date)
    return Path(file)


def test_duplicate_ids_across_two_files_still_give_one_alert_per_flagged_score(fraud) -> None:
    """A second file repeats flagged ids with other amounts: scoring quarantines the repeats,
    and the alerts are the flagged scores with the details of the rows that were scored."""
    store, date = fraud["store"], _day(fraud)
    first = _run(fraud, [transactions, fraud_scores], date)
    assert first.success
    flagged = store.read_output("fraud_scores", date).filter(pc.field("flagged"))
    assert flagged.num_rows >= 4
    landed = store.read_landing(TRANSACTIONS, date, TRANSACTIONS_SCHEMA)
    # 0.5% of the day, under the quarantine limit: repeats of flagged ids, amounts changed.
    repeats = max(4, landed.num_rows // 200)
    ids = flagged["transaction_id"].slice(0, min(repeats, flagged.num_rows))
    copies = landed.filter(pc.is_in(landed["transaction_id"], value_set=ids))
    copies = copies.set_column(3, "amount", pc.add(copies["amount"], 1000.0))
    pq.write_table(copies, _landing_file(store, date).parent / "part-00001.parquet")

    result = _run(fraud, [transactions, fraud_scores, fraud_alerts], date)

    assert result.success, [e.message for e in result.get_step_failure_events()]
    scores = store.read_output("fraud_scores", date)
    held = store.read_output("fraud_scores_quarantine", date)
    meta = asset_metadata(result, "fraud_scores")
    assert meta["rows_in"] == landed.num_rows + copies.num_rows == scores.num_rows + held.num_rows
    assert set(held["reason"].to_pylist()) == {"duplicate_transaction_id"}
    alerts = store.read_output("fraud_alerts", date)
    assert alerts.num_rows == scores.filter(pc.field("flagged")).num_rows
    assert len(pc.unique(alerts["transaction_id"])) == alerts.num_rows
    # Each alert carries the amount of the row that was scored (the first file's), not the copy's.
    original = _by_id(landed, "amount")
    assert _by_id(alerts, "amount") == {
        t: original[t] for t in alerts["transaction_id"].to_pylist()
    }
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert checks["alert_count_matches_flagged_scores"]
    # Amounts landed as floats: the float is the exact value, no text is kept beside it.
    assert alerts["amount_exact"].null_count == alerts.num_rows
    assert held["amount_exact"].null_count == held.num_rows


def test_decimal_amounts_are_scored_as_floats_and_written_out_exactly(fraud) -> None:
    """Spark lands amounts as decimal(18,2): scoring reads them as float64, and the alerts and
    the quarantine keep each amount's exact text beside the float, cents included where a
    double has none (above 2^53 cents)."""
    store, date = fraud["store"], _day(fraud)
    file = _landing_file(store, date)
    landed = pq.read_table(file)
    cents = pc.cast(pc.round(pc.multiply(landed["amount"], 100.0)), pa.int64()).to_pylist()
    amounts = [decimal.Decimal(c).scaleb(-2) for c in cents]
    huge = decimal.Decimal("1234567890123456.78")  # an upstream error: quarantined, kept exact
    amounts[0] = huge
    index = landed.schema.get_field_index("amount")
    spark = landed.set_column(index, "amount", pa.array(amounts, pa.decimal128(18, 2)))
    pq.write_table(spark, file)

    result = _run(fraud, [transactions, fraud_scores, fraud_alerts], date)

    assert result.success, [e.message for e in result.get_step_failure_events()]
    assert asset_metadata(result, TRANSACTIONS)["landing_casts"] == {
        "amount: decimal128(18, 2) -> double": 1
    }
    exact = dict(zip(spark["transaction_id"].to_pylist(), map(str, amounts), strict=True))
    alerts = store.read_output("fraud_alerts", date)
    assert alerts.num_rows > 0
    assert _by_id(alerts, "amount_exact") == {
        t: exact[t] for t in alerts["transaction_id"].to_pylist()
    }
    assert _by_id(alerts, "amount") == {
        t: float(exact[t]) for t in alerts["transaction_id"].to_pylist()
    }
    held = store.read_output("fraud_scores_quarantine", date)
    big = held.filter(pc.equal(held["transaction_id"], spark["transaction_id"][0]))
    assert big["reason"].to_pylist() == ["amount_above_ceiling"]
    assert big["amount_exact"].to_pylist() == ["1234567890123456.78"]
    assert decimal.Decimal(big["amount"][0].as_py()) != huge  # the float alone lost the cents


def test_a_landing_file_replaced_after_scoring_does_not_change_the_alerts(fraud) -> None:
    store, date = fraud["store"], _day(fraud)
    assert _run(fraud, [transactions, fraud_scores], date).success
    scored = store.read_landing(TRANSACTIONS, date, TRANSACTIONS_SCHEMA)
    # The upstream system rewrites the day after it was scored: every amount changes.
    replaced = scored.set_column(3, "amount", pc.multiply(scored["amount"], 3.0))
    pq.write_table(replaced, _landing_file(store, date))

    result = _run(fraud, [fraud_alerts], date)

    assert result.success
    alerts = store.read_output("fraud_alerts", date)
    flagged = store.read_output("fraud_scores", date).filter(pc.field("flagged"))
    assert alerts.num_rows == flagged.num_rows > 0
    amounts, ids = _by_id(scored, "amount"), alerts["transaction_id"].to_pylist()
    assert _by_id(alerts, "amount") == {t: amounts[t] for t in ids}
    # The alerts' scores are the published scores of the same transactions.
    assert _by_id(alerts, "score") == _by_id(flagged, "score")


def test_alerts_refuse_scores_whose_flagged_details_are_from_another_commit(fraud) -> None:
    store, date = fraud["store"], _day(fraud)
    assert _run(fraud, [transactions, fraud_scores], date).success
    # The details of another commit (e.g. written by hand, or before alerts carried them).
    details = store.read_output(FLAGGED, date)
    store.publish(FLAGGED, date, [details], details.schema)

    result = _run(fraud, [fraud_alerts], date)

    assert not result.success
    (failure,) = result.get_step_failure_events()
    message = failure.step_failure_data.error.message
    assert f"re-run fraud_scores for {date}" in message and "commit" in message
    assert failure.step_failure_data.error.cls_name == "Failure"  # bad input: not retried


def test_alerts_read_the_scores_fraud_scores_handed_on_not_a_later_publish(fraud) -> None:
    """Another writer re-publishes the day's scores after fraud_scores materialised it: the
    alerts are still made from the snapshots the materialisation recorded, and say which."""
    from dagster import AssetKey

    from assets.fraud.schemas import SCORES

    store, date = fraud["store"], _day(fraud)
    with DagsterInstance.ephemeral() as instance:

        def run(assets: list):
            return materialize(
                assets, partition_key=date, resources=fraud["resources"], instance=instance
            )

        run([transactions, fraud_scores])
        handed = {name: store.output_figures(name, date) for name in (SCORES, FLAGGED)}
        flagged = store.read_output(SCORES, date).filter(pc.field("flagged")).num_rows
        assert flagged > 0
        # Main moves on: the day re-published with nothing flagged, by a writer Dagster did
        # not see (its scores and details of two different commits, which alerts refuse).
        scores = store.read_output(SCORES, date)
        quiet = scores.set_column(
            scores.schema.get_field_index("flagged"), "flagged", pa.array([False] * len(scores))
        )
        store.publish(SCORES, date, [quiet], scores.schema)

        result = run([fraud_alerts])

        assert result.success
        assert store.read_output("fraud_alerts", date).num_rows == flagged
        # What fraud_scores recorded (its quarantine too, once that table exists) is what the
        # alerts read: the scores and details on main before the later publish.
        scored = instance.get_latest_materialization_event(AssetKey(SCORES))
        recorded = scored.asset_materialization.metadata["table_snapshots"].value
        assert {k: recorded[k] for k in handed} == {k: v.snapshot_id for k, v in handed.items()}
        assert asset_metadata(result, "fraud_alerts")["read_snapshots"] == recorded
        alerts = instance.get_latest_materialization_event(AssetKey("fraud_alerts"))
        recorded = alerts.asset_materialization.metadata["table_snapshots"].value
        assert recorded == {"fraud_alerts": store.output_figures("fraud_alerts", date).snapshot_id}


@pytest.fixture
def small_disk(fraud):
    """``outputs/fraud_scores`` on a 2 MiB tmpfs of its own, so a write can run out of space."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root (CI runs as root)")
    folder = fraud["root"] / "outputs" / "fraud_scores"
    tables = fraud["store"].tables

    def drop_table() -> None:  # its files are about to go: the catalog must forget it too
        if tables.load("fraud_scores") is not None:
            tables.catalog.drop_table(tables.identifier("fraud_scores"))

    drop_table()
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        drop_table()
        subprocess.run(["umount", "-l", str(folder)], check=True)


# One page left: the new table's first metadata cannot be written (the writer creates the
# table before anything else, to write its shards in the table's field ids); four: the
# progress file cannot.
@pytest.mark.parametrize("left", [4096, 16384])
def test_a_full_disk_names_the_file_and_a_rerun_publishes_the_day_whole(
    fraud, small_disk, left: int
) -> None:
    store, date = fraud["store"], _day(fraud)
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (shutil.disk_usage(small_disk).free - left))

    failed = _run(fraud, [transactions, fraud_scores], date)

    assert not failed.success
    (failure,) = failed.get_step_failure_events()
    message = failure.step_failure_data.error.to_string()
    if left == 16384:
        assert f"no space left on device writing {small_disk}/_staging/date={date}/" in message
        assert f"free of 2.0 MiB on {small_disk}/_staging/date={date}" in message
    else:
        table = store.tables.identifier("fraud_scores")
        assert (
            f"no space left on device writing table {table}'s metadata at "
            f"file://{small_disk}/metadata (" in message
        ), message
        assert f"free of 2.0 MiB on {small_disk}" in message
    assert not store.output_exists("fraud_scores", date)  # nothing partial published

    ballast.unlink()
    result = _run(fraud, [transactions, fraud_scores], date)

    assert result.success
    files = store.output_files("fraud_scores", date)
    assert files and all(f.endswith(".parquet") and f"/data/date={date}/" in f for f in files)
    rows = sum(pq.read_metadata(f).num_rows for f in files)
    meta = asset_metadata(result, "fraud_scores")
    assert rows == meta["rows_out"] and meta["rows_in"] == rows + meta["rows_quarantined"]
    assert not list((small_disk / "_staging").glob("**/*"))


def test_the_side_output_is_committed_with_the_scores(fraud) -> None:
    store, date = fraud["store"], _day(fraud)
    assert _run(fraud, [transactions, fraud_scores], date).success
    assert store.output_commit("fraud_scores", date) == store.output_commit(FLAGGED, date)
    # The scoring step's shard files are the day's data files, registered as they are (written
    # in the tables' field ids), not written again through the table.
    commit = store.output_commit("fraud_scores", date)
    for table in ("fraud_scores", FLAGGED):
        names = [Path(f).name for f in store.output_files(table, date)]
        assert names and all(n.startswith(f"{commit}-shard-") for n in names), (table, names)
    flagged = store.read_output(FLAGGED, date)
    scores = store.read_output("fraud_scores", date)
    assert flagged.num_rows == scores.filter(pc.field("flagged")).num_rows
    assert flagged.schema.field("amount").type == pa.float64()


def test_an_alerts_day_its_check_refuses_never_reaches_main(fraud, monkeypatch) -> None:
    """The alert count is checked on the day as staged: an alerts build that loses a flagged
    transaction fails its blocking check, the day is kept off main (on a branch of its own),
    and main keeps the day it had."""
    from assets.fraud import pipeline

    store, date = fraud["store"], _day(fraud)
    first = _run(fraud, [transactions, fraud_scores, fraud_alerts], date)
    assert first.success
    before = store.read_output("fraud_alerts", date)
    before_commit = store.output_commit("fraud_alerts", date)
    assert before.num_rows >= 2

    built = pipeline.flagged_transactions

    def losing_one(store: DataStore, date: str) -> pa.Table:
        rows = built(store, date)
        return rows.slice(1)  # a bug in the build: the highest-scored alert is lost

    monkeypatch.setattr(pipeline, "flagged_transactions", losing_one)
    refused = _run(fraud, [fraud_alerts], date)

    assert not refused.success
    checks = {c.check_name: c.passed for c in refused.get_asset_check_evaluations()}
    assert checks == {"alert_count_matches_flagged_scores": False}
    meta = asset_metadata(refused, "fraud_alerts")
    assert meta["rejected_branch"] and "not published" in meta["main"]
    assert f"main keeps commit {before_commit}" in meta["main"]
    assert store.output_commit("fraud_alerts", date) == before_commit
    assert store.read_output("fraud_alerts", date).equals(before)
