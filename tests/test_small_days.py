"""Quarantine on days of every size: a floor of rows for small days, the share for big ones, and
each quarantined row naming its source file and its row there."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize
from fraud_world import trained_fraud_world
from helpers import asset_metadata, cpu_resources

from assets.documents.assets import documents
from assets.documents.demo_data import generate_day as generate_documents
from assets.documents.schemas import DOCUMENTS_SCHEMA
from assets.fraud.assets import fraud_scores, transactions
from assets.fraud.demo_data import generate_day as generate_transactions
from assets.fraud.schemas import TRANSACTIONS, TRANSACTIONS_SCHEMA
from assets.recommendations import interactions
from assets.recommendations.demo_data import generate_day as generate_interactions
from assets.recommendations.schemas import INTERACTIONS, INTERACTIONS_SCHEMA
from assets.summaries.digest import daily_digest
from assets.summaries.document_summaries import document_summaries
from inference.engine.quarantine import QuarantineLimit, QuarantinePlan, QuarantineRateExceeded
from resources.quality import quarantine_limit
from resources.storage import DataStore, StorageResource

DAY = "2026-03-02"


def _plan(rows: int, bad: int) -> QuarantinePlan:
    return QuarantinePlan(rows, np.arange(bad, dtype=np.int64), np.full(bad, "bad", object))


@pytest.mark.parametrize(
    ("rows", "bad", "fails"),
    [
        (29, 1, False),  # 3.45%, within the floor of 10 rows
        (29, 10, False),  # the floor itself
        (29, 11, True),  # one past the floor, far past the 1% share
        (3, 1, False),  # the floor covers up to half a tiny day...
        (3, 2, True),  # ...never most of it
        (1, 1, True),  # a day whose only row is bad publishes nothing
        (100_000, 1_000, False),  # the share: exactly 1%
        (100_000, 1_001, True),
    ],
)
def test_a_day_fails_above_the_larger_of_share_and_floor(rows: int, bad: int, fails: bool) -> None:
    limit = QuarantineLimit(rate=0.01, floor_rows=10)
    assert limit.exceeded(bad, rows) is fails
    if fails:
        with pytest.raises(QuarantineRateExceeded):
            _plan(rows, bad).check_rate(limit, "x")
    else:
        _plan(rows, bad).check_rate(limit, "x")


def test_a_small_day_over_the_floor_says_the_limit_in_rows() -> None:
    with pytest.raises(QuarantineRateExceeded) as err:
        _plan(29, 11).check_rate(QuarantineLimit(0.01, 10), "document_summaries 2026-03-02")
    assert str(err.value).startswith(
        "document_summaries 2026-03-02: 37.93% of rows (11 of 29) cannot be scored, above the "
        "quarantine limit of 10 rows for a day this small (the 1.00% share allows fewer); "
        "nothing was published. Top reasons: bad 11"
    )


def test_floor_comes_from_config_then_environment(monkeypatch) -> None:
    monkeypatch.delenv("NIGHTSHIFT_QUARANTINE_FLOOR_ROWS", raising=False)
    monkeypatch.delenv("NIGHTSHIFT_MAX_QUARANTINE_RATE", raising=False)
    assert quarantine_limit() == QuarantineLimit(0.01, 10)
    assert quarantine_limit(0.2, 0) == QuarantineLimit(0.2, 0)
    monkeypatch.setenv("NIGHTSHIFT_QUARANTINE_FLOOR_ROWS", "25")
    assert quarantine_limit(0.05) == QuarantineLimit(0.05, 25)
    for bad in ("ten", "-1"):
        monkeypatch.setenv("NIGHTSHIFT_QUARANTINE_FLOOR_ROWS", bad)
        with pytest.raises(ValueError, match="NIGHTSHIFT_QUARANTINE_FLOOR_ROWS"):
            quarantine_limit()


def _failure(result, step: str) -> str:
    assert not result.success
    [failure] = [e for e in result.get_step_failure_events() if e.step_key == step]
    return failure.step_failure_data.error.message


def test_one_bad_document_of_29_is_quarantined_and_the_day_publishes(tmp_path, monkeypatch):
    monkeypatch.delenv("NIGHTSHIFT_QUARANTINE_FLOOR_ROWS", raising=False)
    monkeypatch.delenv("NIGHTSHIFT_MAX_QUARANTINE_RATE", raising=False)
    store = DataStore(str(tmp_path / "data"))
    generate_documents(store, DAY, scale=0.1)
    day = store.read_landing("documents", DAY, DOCUMENTS_SCHEMA).slice(0, 29)
    bodies = day["body"].to_pylist()
    bodies[7] = "A sentence that repeats itself. " * 64_000  # about 2 MB: text_too_long
    day = day.set_column(day.schema.get_field_index("body"), "body", pa.array(bodies))
    store.write_landing("documents", DAY, day)
    resources = cpu_resources(tmp_path / "data", max_batch_size=64)
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [documents, document_summaries, daily_digest],
            partition_key=DAY,
            resources=resources,
            instance=instance,
            raise_on_error=False,
        )
    assert result.success
    # The landing contract flags the document as a WARN, not a block, and says why.
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    usable = checks["document_texts_usable"]
    assert not usable.passed and usable.severity.value == "WARN"
    assert "1 of 29 rows cannot be scored (3.45%, limit 10 rows" in usable.description
    assert "they will be quarantined, not scored" in usable.description
    meta = asset_metadata(result, "document_summaries")
    assert meta["quarantine_reasons"] == {"text_too_long": 1}
    held = store.read_output("document_summaries_quarantine", DAY)
    summaries = store.read_output("document_summaries", DAY)
    assert held["row_number"].to_pylist() == [7] and held["reason"].to_pylist() == ["text_too_long"]
    [landed] = store.landing_files("documents", DAY)
    assert held["source_file"].to_pylist() == [store.uri(landed)]
    assert held["source_row_number"].to_pylist() == [7]
    assert summaries.num_rows + held.num_rows == 29
    assert day["doc_id"][7].as_py() not in summaries["doc_id"].to_pylist()
    digest = store.read_output("daily_digest", DAY)
    assert sum(digest["doc_count"].to_pylist()) == 28


def test_two_percent_of_a_100k_day_still_fails_with_the_share_message(tmp_path) -> None:
    world = trained_fraud_world(tmp_path / "data", "2026-04-01", 0.02)
    store, date = world["store"], "2026-04-02"
    generate_transactions(store, date, scale=1.0)
    table = store.read_landing(TRANSACTIONS, date, TRANSACTIONS_SCHEMA)
    rows = table.num_rows
    assert rows >= 100_000
    bad = int(rows * 0.02)
    amounts = table["amount"].to_numpy().copy()
    amounts[:bad] = np.nan
    table = table.set_column(table.schema.get_field_index("amount"), "amount", [amounts])
    store.write_landing(TRANSACTIONS, date, table)
    rate = f"{bad / rows:.2%}"
    with DagsterInstance.ephemeral() as instance:
        blocked = materialize(
            [transactions, fraud_scores], partition_key=date, resources=world["resources"],
            instance=instance, raise_on_error=False,
        )  # fmt: skip
        alone = materialize(
            [fraud_scores], partition_key=date, resources=world["resources"],
            instance=instance, raise_on_error=False,
        )  # fmt: skip
    verdict = {c.check_name: c for c in blocked.get_asset_check_evaluations()}[
        "transaction_values_in_range"
    ]
    assert not verdict.passed and verdict.severity.value == "ERROR"
    assert verdict.description.startswith(
        f"{bad} of {rows} rows cannot be scored ({rate}, limit 1.00%): non_finite_amount {bad}; "
        "above the quarantine limit"
    )
    message = _failure(alone, "fraud_scores")
    assert (
        f"fraud_scores {date}: {rate} of rows ({bad} of {rows}) cannot be scored, above the "
        "1.00% quarantine limit; nothing was published. Top reasons: non_finite_amount"
    ) in message
    assert not store.output_exists("fraud_scores", date)
    assert not store.output_exists("fraud_scores_quarantine", date)


def _split_in_two(store: DataStore, dataset: str, date: str, table: pa.Table, first: int) -> str:
    """Replaces the day with two files, ``first`` rows in the first; returns the second's path."""
    store.write_landing(dataset, date, table.slice(0, first))
    second = f"{store.landing_path(dataset, date)}/part-00001.parquet"
    pq.write_table(table.slice(first), second, filesystem=store.fs)
    return second


def test_a_quarantined_transaction_names_its_file_and_row_there(tmp_path) -> None:
    world = trained_fraud_world(tmp_path / "data", "2026-04-01", 0.02)
    store, date = world["store"], "2026-04-02"
    generate_transactions(store, date, scale=0.02)
    table = store.read_landing(TRANSACTIONS, date, TRANSACTIONS_SCHEMA)
    amounts = table["amount"].to_numpy().copy()
    amounts[[1205, 1217]] = np.nan  # rows 5 and 17 of the second file
    table = table.set_column(table.schema.get_field_index("amount"), "amount", [amounts])
    second = _split_in_two(store, TRANSACTIONS, date, table, 1200)
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [transactions, fraud_scores], partition_key=date, resources=world["resources"],
            instance=instance,
        )  # fmt: skip
    assert result.success
    held = store.read_output("fraud_scores_quarantine", date).sort_by("row_number")
    assert held["row_number"].to_pylist() == [1205, 1217]  # across the day, as before
    assert held["source_file"].to_pylist() == [store.uri(second)] * 2
    assert held["source_row_number"].to_pylist() == [5, 17]
    found = pq.read_table(second).take([5, 17])
    assert found["transaction_id"].to_pylist() == held["transaction_id"].to_pylist()


def test_a_quarantined_interaction_names_its_file_and_row_there(tmp_path) -> None:
    store = DataStore(str(tmp_path / "data"))
    generate_interactions(store, DAY, scale=0.05)
    table = store.read_landing(INTERACTIONS, DAY, INTERACTIONS_SCHEMA)
    first = table.num_rows // 2
    weights = table["weight"].to_numpy().copy()
    weights[[3, first + 4]] = -1.0  # row 3 of the first file, row 4 of the second
    table = table.set_column(table.schema.get_field_index("weight"), "weight", [weights])
    second = _split_in_two(store, INTERACTIONS, DAY, table, first)
    [first_file, _] = store.landing_files(INTERACTIONS, DAY)
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [interactions], partition_key=DAY, instance=instance,
            resources={"storage": StorageResource(data_root=str(tmp_path / "data"))},
        )  # fmt: skip
    assert result.success
    held = store.read_output("interactions_quarantine", DAY).sort_by("row_number")
    assert held["row_number"].to_pylist() == [3, first + 4]
    assert held["source_file"].to_pylist() == [store.uri(first_file), store.uri(second)]
    assert held["source_row_number"].to_pylist() == [3, 4]
