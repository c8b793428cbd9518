"""The bad-input corpus: each malformed landing partition ends in one exact outcome — a named
error, or a counted quarantine with rows conserved — and nothing is published on failure."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from dagster import AssetKey, DagsterInstance, Failure, materialize
from fraud_world import trained_fraud_world
from helpers import asset_metadata, cpu_resources

from assets.documents.assets import documents
from assets.documents.demo_data import generate_day as generate_documents
from assets.documents.schemas import DOCUMENTS_SCHEMA
from assets.fraud.assets import fraud_alerts, fraud_scores, transactions
from assets.fraud.demo_data import generate_day as generate_transactions
from assets.fraud.schemas import TRANSACTIONS, TRANSACTIONS_SCHEMA
from assets.recommendations import interactions, recommendation_model, user_recommendations
from assets.recommendations.demo_data import generate_day as generate_interactions
from assets.recommendations.schemas import INTERACTIONS, INTERACTIONS_SCHEMA
from assets.recommendations.training import current_model, load_recommender
from assets.summaries.digest import daily_digest
from assets.summaries.document_summaries import document_summaries
from inference.engine.device import make_runtime
from resources.storage import DataStore


@dataclass(frozen=True)
class Quarantined:
    """The run succeeds; exactly these rows are quarantined, by reason."""

    reasons: dict[str, int]


@dataclass(frozen=True)
class Fails:
    """The run fails in ``step``, with a message holding every fragment; nothing is published.
    ``{file}``, ``{date}`` and ``{folder}`` stand for the landing file, date and folder."""

    step: str
    fragments: list[str] = field(default_factory=list)


Mutation = Callable[[pa.Table], pa.Table]


def _set(column: str, values: dict[int, object]) -> Mutation:
    def mutate(table: pa.Table) -> pa.Table:
        data = table[column].to_pylist()
        for row, value in values.items():
            data[row] = value(data[row]) if callable(value) else value
        index = table.schema.get_field_index(column)
        return table.set_column(index, column, pa.array(data, table.schema.field(column).type))

    return mutate


def _dtype(table: pa.Table) -> pa.Table:
    return table.set_column(3, "amount", pc.cast(table["amount"], pa.string()))


FRAUD_CASES = {
    "missing_column": (
        lambda t: t.drop_columns(["amount"]),
        Fails("transactions", ["{file}", "required column 'amount'", "{date}"]),
    ),
    "wrong_dtype": (
        _dtype,
        Fails("transactions", ["{file}", "column 'amount' has type string, expected double"]),
    ),
    "null_transaction_ids": (
        _set("transaction_id", {3: None, 17: None}),
        Quarantined({"null_transaction_id": 2}),
    ),
    "null_feature": (_set("merchant_id", {5: None}), Quarantined({"null_merchant_id": 1})),
    "nan_and_inf_amounts": (
        _set("amount", {1: float("nan"), 2: float("inf"), 4: float("-inf")}),
        Quarantined({"non_finite_amount": 3}),
    ),
    "negative_amount": (_set("amount", {9: -12.5}), Quarantined({"negative_amount": 1})),
    "duplicate_ids": (
        _set("transaction_id", {11: "tx-dup", 12: "tx-dup", 40: "tx-dup"}),
        Quarantined({"duplicate_transaction_id": 2}),
    ),
    "timestamps_outside_the_day": (
        _set("ts", {6: lambda ts: ts + timedelta(days=1), 7: lambda ts: ts - timedelta(days=2)}),
        Quarantined({"ts_outside_day": 2}),
    ),
    "empty_partition": (
        lambda t: t.slice(0, 0),
        Fails("transactions", ["landing partition empty", "'transactions'", "{date}", "{folder}"]),
    ),
}


@pytest.fixture(scope="module")
def fraud(tmp_path_factory) -> dict:
    """A data root with a trained fraud model; each case lands its own day beside it."""
    world = trained_fraud_world(tmp_path_factory.mktemp("bad_fraud") / "data", "2026-04-01", 0.02)
    return {**world, "next_day": iter(range(2, 29))}


def _fraud_day(fraud: dict, mutate: Mutation | None = None) -> tuple[str, int]:
    """Lands a fresh day (2,000 transactions), mutated; returns its date and landed rows."""
    store, date = fraud["store"], f"2026-04-{next(fraud['next_day']):02d}"
    generate_transactions(store, date, scale=0.02)
    table = store.read_landing(TRANSACTIONS, date, TRANSACTIONS_SCHEMA)
    if mutate is not None:
        table = mutate(table)
        store.write_landing(TRANSACTIONS, date, table)
    return date, table.num_rows


def _score(fraud: dict, date: str, config: dict | None = None):
    ops = {op: {"config": config} for op in ("transactions", "fraud_scores")} if config else {}
    with DagsterInstance.ephemeral() as instance:
        return materialize(
            [transactions, fraud_scores],
            partition_key=date,
            resources=fraud["resources"],
            instance=instance,
            raise_on_error=False,
            run_config={"ops": ops},
        )


def _failure(result, step: str) -> str:
    assert not result.success
    failures = {e.step_key: e for e in result.get_step_failure_events()}
    assert set(failures) == {step}, failures
    error = failures[step].step_failure_data.error
    return error.message.removeprefix(f"{error.cls_name}: ").removeprefix(
        f"{Failure.__module__}.{error.cls_name}: "
    )


def _assert_nothing_published(store: DataStore, asset: str, date: str) -> None:
    assert not store.output_exists(asset, date)
    assert not store.output_exists(f"{asset}_quarantine", date)


@pytest.mark.parametrize("case", list(FRAUD_CASES))
def test_fraud_bad_input(fraud: dict, case: str) -> None:
    mutate, outcome = FRAUD_CASES[case]
    date, landed = _fraud_day(fraud, mutate)
    _assert_outcome(fraud["store"], _score(fraud, date), date, landed, outcome)


def _assert_outcome(store: DataStore, result, date: str, landed: int, outcome) -> None:
    if isinstance(outcome, Fails):
        message = _failure(result, outcome.step)
        folder = store.landing_path(TRANSACTIONS, date)
        files = store.landing_files(TRANSACTIONS, date)
        for fragment in outcome.fragments:
            expected = fragment.format(file=files[0], date=date, folder=folder)
            assert expected in message, message
        _assert_nothing_published(store, "fraud_scores", date)
        return
    assert result.success
    meta = asset_metadata(result, "fraud_scores")
    held = store.read_output("fraud_scores_quarantine", date)
    scores = store.read_output("fraud_scores", date)
    quarantined = sum(outcome.reasons.values())
    assert meta["quarantine_reasons"] == outcome.reasons
    assert (
        dict(zip(*np.unique(held["reason"].to_numpy(False), return_counts=True), strict=True))
        == outcome.reasons
    )
    # Row conservation: every landed row is scored once or quarantined once.
    assert meta["rows_in"] == landed == scores.num_rows + held.num_rows
    assert meta["rows_quarantined"] == held.num_rows == quarantined
    assert scores["transaction_id"].null_count == 0
    assert len(pc.unique(scores["transaction_id"])) == scores.num_rows
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["row_count_matches_input"].passed
    # The landing contract failed, but only as a WARN: the rows were quarantined, not lost.
    contract = [
        c for c in checks.values() if c.asset_key == AssetKey("transactions") and not c.passed
    ]
    assert contract and {c.severity.value for c in contract} == {"WARN"}
    assert "they will be quarantined" in contract[0].description


def test_duplicate_ids_keep_the_first_row(fraud: dict) -> None:
    date, _ = _fraud_day(fraud, _set("transaction_id", {20: "tx-twice", 30: "tx-twice"}))
    assert _score(fraud, date).success
    held = fraud["store"].read_output("fraud_scores_quarantine", date)
    assert held.select(["transaction_id", "row_number", "reason"]).to_pylist() == [
        {"transaction_id": "tx-twice", "row_number": 30, "reason": "duplicate_transaction_id"}
    ]


def test_truncated_parquet_file_fails_naming_the_file(fraud: dict) -> None:
    date, _ = _fraud_day(fraud)
    file = fraud["store"].landing_files(TRANSACTIONS, date)[0]
    with open(file, "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    message = _failure(_score(fraud, date), "transactions")
    assert f"unreadable parquet file {file}" in message and date in message
    assert "Parquet magic bytes not found" in message
    _assert_nothing_published(fraud["store"], "fraud_scores", date)


def test_corrupt_page_fails_naming_file_row_group_column_and_bytes(fraud: dict) -> None:
    date, _ = _fraud_day(fraud)
    file = fraud["store"].landing_files(TRANSACTIONS, date)[0]
    meta = pq.ParquetFile(file).metadata
    chunk = meta.row_group(0).column(TRANSACTIONS_SCHEMA.get_field_index("amount"))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    with open(file, "r+b") as f:  # the page header becomes garbage; the footer stays valid
        f.seek(start)
        f.write(b"\xff" * 16)
    message = _failure(_score(fraud, date), "transactions")
    end = start + chunk.total_compressed_size
    assert f"{file} in dataset 'transactions', date {date}, row group 0, column 'amount'" in message
    assert f"bytes {start}-{end}" in message
    _assert_nothing_published(fraud["store"], "fraud_scores", date)


def test_too_many_bad_rows_fail_with_the_rate_and_top_reasons(fraud: dict) -> None:
    bad = {i: float("nan") for i in range(0, 60, 2)} | {i: -1.0 for i in range(1, 21, 2)}
    date, landed = _fraud_day(fraud, _set("amount", bad))
    # In the job, the landing contract check blocks scoring before any inference...
    result = _score(fraud, date)
    assert "blocking asset check" in _failure(result, "transactions")
    blocked = {c.check_name: c for c in result.get_asset_check_evaluations()}
    verdict = blocked["transaction_values_in_range"]
    assert not verdict.passed and verdict.severity.value == "ERROR"
    assert verdict.description == (
        f"40 of {landed} rows cannot be scored (2.00%, limit 1.00%): non_finite_amount 30, "
        "negative_amount 10; above the quarantine limit: scoring is blocked and nothing will "
        "be published"
    )
    # ...and scoring on its own refuses the day with the same figures.
    with DagsterInstance.ephemeral() as instance:
        alone = materialize(
            [fraud_scores], partition_key=date, resources=fraud["resources"],
            instance=instance, raise_on_error=False,
        )  # fmt: skip
    assert _failure(alone, "fraud_scores").startswith(
        f"fraud_scores {date}: 2.00% of rows (40 of {landed}) cannot be scored, above the 1.00% "
        "quarantine limit; nothing was published. Top reasons: non_finite_amount 30, "
        "negative_amount 10"
    )
    _assert_nothing_published(fraud["store"], "fraud_scores", date)
    # A deployment that accepts more bad rows scores the day and quarantines them.
    assert _score(fraud, date, {"max_quarantine_rate": 0.05}).success
    assert fraud["store"].read_output("fraud_scores_quarantine", date).num_rows == 40


def test_files_that_are_not_data_are_skipped(fraud: dict) -> None:
    # A day as Spark leaves it mid-write: the committed file, a copy of it in an unfinished
    # task's _temporary folder (listed first, it would make the committed rows duplicates), the
    # commit marker and a checksum file.
    store = fraud["store"]
    date, landed = _fraud_day(fraud)
    folder = Path(store.landing_path(TRANSACTIONS, date))
    committed = folder / "part-00000.parquet"
    unfinished = folder / "_temporary" / "0" / "task_0" / "part-00000.parquet"
    unfinished.parent.mkdir(parents=True)
    shutil.copy(committed, unfinished)
    (folder / "_SUCCESS").write_bytes(b"")
    (folder / ".part-00000.parquet.crc").write_bytes(b"crc\x00\x01")
    assert store.landing_files(TRANSACTIONS, date) == [str(committed)]

    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [transactions, fraud_scores, fraud_alerts],
            partition_key=date,
            resources=fraud["resources"],
            instance=instance,
        )
    assert result.success
    source, scored = asset_metadata(result, "transactions"), asset_metadata(result, "fraud_scores")
    assert source["dagster/row_count"] == landed == pq.ParquetFile(committed).metadata.num_rows
    assert source["landing_files_skipped"] == 3
    # Nothing is a duplicate, and every committed row is scored once or quarantined once.
    assert "duplicate_transaction_id" not in scored["quarantine_reasons"]
    scores = store.read_output("fraud_scores", date)
    held = scored["rows_quarantined"]
    assert scored["rows_in"] == landed == scores.num_rows + held
    assert len(pc.unique(scores["transaction_id"])) == scores.num_rows


# -- documents: text that cannot be summarised ------------------------------------------------

DOCS_DAY = "2026-03-02"


@pytest.fixture(scope="module")
def bad_documents(tmp_path_factory) -> dict:
    """15 generated documents, 3 of which cannot be summarised, and a duplicate doc_id."""
    root = tmp_path_factory.mktemp("bad_docs") / "data"
    store = DataStore(str(root))
    generate_documents(store, DOCS_DAY, scale=0.03)
    table = store.read_landing("documents", DOCS_DAY, DOCUMENTS_SCHEMA)
    bodies = [b.encode() for b in table["body"].to_pylist()]
    titles = table["title"].to_pylist()
    bodies[2] = b"Caf\xe9 au lait: not UTF-8 at all."  # Latin-1 bytes
    bodies[5], titles[5] = b"   ", ""
    bodies[8] = ("A sentence that repeats. " * 42_000).encode()  # about 1 MB
    ids = table["doc_id"].to_pylist()
    ids[11] = ids[10]
    table = table.set_column(0, "doc_id", pa.array(ids))
    table = table.set_column(2, "title", pa.array(titles))
    table = table.set_column(3, "body", pa.array(bodies, pa.binary()).view(pa.string()))
    store.write_landing("documents", DOCS_DAY, table)
    resources = cpu_resources(root, max_batch_size=64)
    return {"store": store, "resources": resources, "rows": table.num_rows, "ids": ids}


def _summarise(world: dict, limit: float | None, floor_rows: int | None = None):
    config = {"max_quarantine_rate": limit} if limit is not None else {}
    if floor_rows is not None:
        config["quarantine_floor_rows"] = floor_rows
    ops = {op: {"config": config} for op in ("documents", "document_summaries")}
    with DagsterInstance.ephemeral() as instance:
        return materialize(
            [documents, document_summaries, daily_digest],
            partition_key=DOCS_DAY,
            resources=world["resources"],
            instance=instance,
            raise_on_error=False,
            run_config={"ops": ops},
        )


def test_unusable_documents_are_quarantined_by_reason(bad_documents: dict) -> None:
    store = bad_documents["store"]
    # Four of fifteen documents (27%) is far above the default 1%: without the floor of rows
    # any day may quarantine (by default up to 7 of these 15), nothing is summarised...
    blocked = _summarise(bad_documents, None, floor_rows=0)
    assert "blocking asset check" in _failure(blocked, "documents")
    _assert_nothing_published(store, "document_summaries", DOCS_DAY)
    # ...unless the run allows it, when each is set aside with its reason.
    result = _summarise(bad_documents, 0.3)
    assert result.success
    meta = asset_metadata(result, "document_summaries")
    expected = {"invalid_utf8": 1, "empty_text": 1, "text_too_long": 1, "duplicate_doc_id": 1}
    assert meta["quarantine_reasons"] == expected
    held = store.read_output("document_summaries_quarantine", DOCS_DAY)
    assert held["row_number"].to_pylist() == [2, 5, 8, 11]
    summaries = store.read_output("document_summaries", DOCS_DAY)
    assert summaries.num_rows + held.num_rows == bad_documents["rows"] == meta["rows_in"]
    assert summaries["doc_id"].to_pylist() == [
        d for i, d in enumerate(bad_documents["ids"]) if i not in (2, 5, 8, 11)
    ]
    # The documents' contract failed as a WARN only, so the digest still ran.
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    for name in ("document_ids_present_and_unique", "document_texts_usable"):
        assert not checks[name].passed and checks[name].severity.value == "WARN"
    digest = store.read_output("daily_digest", DOCS_DAY)
    assert sum(digest["doc_count"].to_pylist()) == summaries.num_rows
    assert all(checks[n].passed for n in ("summaries_cover_every_document", "summaries_not_blank"))
    assert checks["summaries_drawn_from_documents"].passed


# -- interactions: ids that do not resolve -----------------------------------------------------

REC_DAYS = ["2026-03-01", "2026-03-02", "2026-03-03"]


@pytest.fixture(scope="module")
def recs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bad_recs") / "data"
    store = DataStore(str(root))
    for day in REC_DAYS[:2]:
        generate_interactions(store, day, scale=0.05)
    resources = cpu_resources(root)
    with DagsterInstance.ephemeral() as instance:
        assert materialize([recommendation_model], resources=resources, instance=instance).success
    version = current_model(store).version
    model = load_recommender(store, version, make_runtime("cpu", "fp32"))
    return {"store": store, "resources": resources, "model": model}


def _recommend(recs: dict, date: str):
    with DagsterInstance.ephemeral() as instance:
        return materialize(
            [interactions, user_recommendations],
            partition_key=date,
            resources=recs["resources"],
            instance=instance,
            raise_on_error=False,
            run_config={"ops": {"user_recommendations": {"config": {"k": 5}}}},
        )


def test_unknown_user_and_item_are_counted_not_dropped(recs: dict) -> None:
    store, date = recs["store"], REC_DAYS[2]
    generate_interactions(store, date, scale=0.05)
    day = store.read_landing(INTERACTIONS, date, INTERACTIONS_SCHEMA)
    extra = day.slice(0, 2).to_pylist()
    extra[0]["user_id"] = 10**12  # a user the model has never met
    extra[1]["item_id"] = 10**12  # an item outside the model's catalogue
    extra = pa.Table.from_pylist(extra, INTERACTIONS_SCHEMA)
    store.write_landing(INTERACTIONS, date, pa.concat_tables([day, extra]))
    model = recs["model"]
    # What the clean day alone would count: the generator's own newcomers and new items. The
    # users are the audience: everyone seen within the trailing 90 days, not only that day.
    items = day["item_id"].to_numpy()
    landed = [store.read_landing(INTERACTIONS, d, INTERACTIONS_SCHEMA) for d in REC_DAYS[:2]]
    users = np.unique(pa.concat_tables([*landed, day])["user_id"].to_numpy())
    unknown = items[model.items.index(items) < 0]
    cold = int((model.users.index(users) < 0).sum())
    result = _recommend(recs, date)
    assert result.success
    meta = asset_metadata(result, "user_recommendations")
    assert meta["unknown_items"] == len(np.unique(unknown)) + 1
    assert meta["unknown_item_interactions"] == len(unknown) + 1
    assert meta["cold_start_users"] == cold + 1
    assert meta["rows_quarantined"] == 0
    lists = store.read_output("user_recommendations", date)
    newcomer = lists.filter(pc.equal(lists["user_id"], 10**12))
    assert newcomer["rank"].to_pylist() == [1, 2, 3, 4, 5]  # popular items, not nothing
    assert not pc.any(pc.equal(lists["item_id"], 10**12)).as_py()
    assert meta["rows_in"] == len(users) + 1 == len(pc.unique(lists["user_id"]))
    assert all(
        c.passed for c in result.get_asset_check_evaluations() if c.severity.value == "ERROR"
    )


def test_interaction_without_a_user_fails_naming_file_and_column(recs: dict) -> None:
    store, date = recs["store"], "2026-03-04"
    generate_interactions(store, date, scale=0.05)
    day = store.read_landing(INTERACTIONS, date, INTERACTIONS_SCHEMA)
    users = day["user_id"].to_pylist()
    users[7] = None
    path = store.write_landing(
        INTERACTIONS, date, day.set_column(0, "user_id", pa.array(users, pa.int64()))
    )
    message = _failure(_recommend(recs, date), "interactions")
    assert message.startswith(
        f"{path} (dataset 'interactions', date {date}): column 'user_id' has 1 null values"
    )
    _assert_nothing_published(store, "user_recommendations", date)
