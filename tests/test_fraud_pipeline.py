"""The fraud assets end to end on generated data: generator, training, scoring, alerts, failures."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from dagster import AssetKey, materialize
from helpers import asset_metadata

from assets.fraud import defs
from assets.fraud.assets import (
    fraud_alerts,
    fraud_model,
    fraud_model_auprc_above_floor,
    fraud_scores,
    transactions,
)
from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import (
    LABELLED_SCHEMA,
    SCORES_SCHEMA,
    TRANSACTIONS,
    TRANSACTIONS_LABELLED,
    TRANSACTIONS_SCHEMA,
)
from resources.storage import DataStore

SCALE = 0.02
DAYS = ["2026-03-01", "2026-03-02", "2026-03-03"]
ALL = [transactions, fraud_model, fraud_scores, fraud_alerts, fraud_model_auprc_above_floor]


def _failure_text(result) -> str:
    failures = result.get_step_failure_events()
    assert failures, "expected a failed step"
    # A dagster Failure with allow_retries=False: bad input is not worth the retry budget.
    assert {e.step_failure_data.error.cls_name for e in failures} == {"Failure"}
    return "\n".join(e.step_failure_data.error.to_string() for e in failures)


@pytest.fixture
def landed(store):
    return {day: generate_day(store, day, scale=SCALE, seed=0) for day in DAYS}


def test_definitions_hold_the_contract_assets():
    assert {k.to_user_string() for a in defs.assets for k in a.keys} == {
        "transactions",
        "transaction_screens",
        "fraud_model",
        "fraud_scores",
        "fraud_alerts",
        # The challenger's shadow scores (assets/shadow/), off unless NIGHTSHIFT_SHADOW is set.
        "fraud_scores_shadow",
    }
    checks = {key.name for a in [*defs.assets, *defs.asset_checks] for key in a.check_keys}
    assert checks == {
        "fraud_model_auprc_above_floor",
        "transaction_ids_present_and_unique",
        "transaction_values_in_range",
        "transactions_landed_on_time",
        "row_count_matches_input",
        "scores_in_unit_interval",
        "transaction_ids_unique",
        "flagged_matches_threshold",
        "model_version_present",
        "flagged_rate_near_trailing_mean",
        "score_distribution_matches_training",
        "features_within_training_range",
        "feature_drift_below_limit",
        "alert_count_matches_flagged_scores",
        "shadow_agrees_with_champion",  # a warning on the shadow's agreement, never blocking
    }


def test_generator_is_deterministic_and_shaped_like_the_contract(store, tmp_path):
    counts = generate_day(store, "2026-03-01", scale=SCALE, seed=0)
    other = DataStore(str(tmp_path / "other"))
    assert generate_day(other, "2026-03-01", scale=SCALE, seed=0) == counts

    def file_bytes(s, dataset, day):
        return [s.read_bytes(f) for f in s.landing_files(dataset, day)]

    for dataset in (TRANSACTIONS, TRANSACTIONS_LABELLED):
        assert file_bytes(store, dataset, "2026-03-01") == file_bytes(other, dataset, "2026-03-01")
    generate_day(other, "2026-03-02", scale=SCALE, seed=0)
    day1 = store.read_landing(TRANSACTIONS, "2026-03-01", TRANSACTIONS_SCHEMA)
    day2 = other.read_landing(TRANSACTIONS, "2026-03-02", TRANSACTIONS_SCHEMA)
    assert not np.array_equal(day1["amount"].to_numpy()[:100], day2["amount"].to_numpy()[:100])

    labelled = store.read_landing(TRANSACTIONS_LABELLED, "2026-03-01", LABELLED_SCHEMA)
    schema = pq.read_schema(store.landing_files(TRANSACTIONS, "2026-03-01")[0], filesystem=store.fs)
    assert schema.equals(TRANSACTIONS_SCHEMA)
    assert counts == {TRANSACTIONS: 2000, TRANSACTIONS_LABELLED: 2000}
    assert len(set(day1["transaction_id"].to_pylist())) == day1.num_rows
    assert 0.005 <= pc.mean(labelled["is_fraud"]).as_py() <= 0.02


def test_one_partition_end_to_end(landed, store, resources, instance):
    day = DAYS[-1]
    result = materialize(ALL, partition_key=day, resources=resources, instance=instance)
    assert result.success

    model = asset_metadata(result, "fraud_model")
    print(f"generated (scale {SCALE}): AUPRC {model['val_auprc']}, ROC-AUC {model['val_roc_auc']}")
    assert model["reused"] is False and model["training_days"] == 3
    assert model["val_auprc"] >= 0.5 and model["val_roc_auc"] >= 0.9
    assert {"threshold", "features", "normalisation", "model_version"} <= set(model)

    scores = store.read_output("fraud_scores", day)
    assert scores.schema.equals(SCORES_SCHEMA)
    assert scores.num_rows == landed[day][TRANSACTIONS]
    score = scores["score"].to_numpy()
    assert 0.0 <= score.min() and score.max() <= 1.0
    threshold = model["threshold"]
    assert np.array_equal(scores["flagged"].to_numpy(), score >= np.float32(threshold))
    assert set(scores["model_version"].to_pylist()) == {model["model_version"]}

    meta = asset_metadata(result, "fraud_scores", day)
    assert meta["rows_in"] == meta["rows_out"] == scores.num_rows
    assert meta["model_loads"] == 1 and meta["model_version"] == model["model_version"]
    assert meta["oom_backoffs"] == 0 and meta["model_batch_size"] > 0  # the back-off's record
    assert meta["flagged"] == int(scores["flagged"].to_numpy().sum())

    alerts = store.read_output("fraud_alerts", day)
    assert alerts.num_rows == meta["flagged"] > 0
    assert {"account_id", "merchant_id", "amount", "score"} <= set(alerts.column_names)
    assert alerts["score"].to_pylist() == sorted(alerts["score"].to_pylist(), reverse=True)
    labels = store.read_landing(TRANSACTIONS_LABELLED, day, LABELLED_SCHEMA)
    fraud = pc.filter(labels["transaction_id"], pc.equal(labels["is_fraud"], 1))
    fraud_ids = set(fraud.to_pylist())
    assert len(fraud_ids & set(alerts["transaction_id"].to_pylist())) >= alerts.num_rows // 2
    assert all(c.passed for c in result.get_asset_check_evaluations())


def test_range_backfill_writes_each_partition_and_loads_the_model_once(
    landed, store, resources, instance
):
    tags = {
        "dagster/asset_partition_range_start": DAYS[0],
        "dagster/asset_partition_range_end": DAYS[-1],
    }
    result = materialize(ALL, partition_key=None, tags=tags, resources=resources, instance=instance)
    assert result.success
    for day in DAYS:
        assert store.read_output("fraud_scores", day).num_rows == landed[day][TRANSACTIONS]
        assert store.output_exists("fraud_alerts", day)
    # Each day is its own materialisation, with its own rows and output, recorded once.
    days = [
        e.partition
        for e in result.get_asset_materialization_events()
        if e.asset_key == AssetKey("fraud_scores")
    ]
    assert sorted(days) == DAYS
    for day in DAYS:
        meta = asset_metadata(result, "fraud_scores", day)
        assert meta["model_loads"] == 1 and meta["partitions"] == 3
        assert meta["rows_out"] == meta["dagster/row_count"] == landed[day][TRANSACTIONS]
        assert meta["output"].endswith(f"date={day}")


def test_model_is_reused_unless_retrain_and_retraining_is_reproducible(landed, resources, instance):
    def train(run_config: dict | None = None) -> dict:
        result = materialize(
            [fraud_model], run_config=run_config, resources=resources, instance=instance
        )
        return asset_metadata(result, "fraud_model")

    first, again = train(), train()
    assert again["reused"] is True and again["model_version"] == first["model_version"]
    meta = train({"ops": {"fraud_model": {"config": {"retrain": True}}}})
    # Same history, same seed: same weights, so the content-hash version is the same too.
    assert meta["reused"] is False and meta["model_version"] == first["model_version"]


def test_missing_landing_partition_fails_and_publishes_nothing(landed, store, resources, instance):
    assert materialize([fraud_model], resources=resources, instance=instance).success
    missing = "2026-03-09"
    result = materialize(
        [fraud_scores],
        partition_key=missing,
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    text = _failure_text(result)
    assert "'transactions'" in text and missing in text
    assert store.landing_path(TRANSACTIONS, missing) in text
    assert not store.output_exists("fraud_scores", missing)


def test_missing_column_fails_naming_file_and_column(landed, store, resources, instance):
    day = DAYS[0]
    table = store.read_landing(TRANSACTIONS, day, TRANSACTIONS_SCHEMA).drop_columns(["amount"])
    store.write_landing(TRANSACTIONS, day, table)
    result = materialize(
        [transactions, fraud_model, fraud_scores],
        partition_key=day,
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    text = _failure_text(result)
    assert "'amount'" in text and store.landing_files(TRANSACTIONS, day)[0] in text
    assert not store.output_exists("fraud_scores", day)


def test_rerunning_a_partition_replaces_it(landed, store, resources, instance):
    day = DAYS[1]
    for _ in range(2):
        assert materialize(ALL, partition_key=day, resources=resources, instance=instance).success
    # Replaced, not appended: main holds the second commit's files alone.
    assert len(store.output_files("fraud_scores", day)) == 1
    history = store.tables.history("fraud_scores", day)
    assert [where for _, where in history].count("current") == 1
    assert store.read_output("fraud_scores", day).num_rows == landed[day][TRANSACTIONS]


def test_a_model_below_the_auprc_floor_blocks_scoring(landed, store, resources, instance):
    # Shuffled labels carry no signal: the model trains, but must not score anything.
    rng = np.random.default_rng(0)
    for day in DAYS:
        table = store.read_landing(TRANSACTIONS_LABELLED, day, LABELLED_SCHEMA)
        shuffled = pa.array(rng.permutation(table["is_fraud"].to_numpy()), pa.int8())
        store.write_landing(TRANSACTIONS_LABELLED, day, table.set_column(8, "is_fraud", shuffled))
    result = materialize(
        ALL, partition_key=DAYS[0], resources=resources, instance=instance, raise_on_error=False
    )
    assert not result.success
    (check,) = [c for c in result.get_asset_check_evaluations() if not c.passed]
    assert check.check_name == "fraud_model_auprc_above_floor"
    assert not store.output_exists("fraud_scores", DAYS[0])
