"""Fraud scores never go silently wrong: amounts beyond the contract are quarantined, features beyond training are clamped and marked, drift against training warns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from dagster import DagsterInstance, materialize
from fraud_world import trained_fraud_world
from helpers import asset_metadata

from assets.fraud.assets import fraud_scores, transactions
from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import AMOUNT_CEILING, TRANSACTIONS, TRANSACTIONS_SCHEMA
from inference.tabular.ranges import REVIEW_MARGIN, FeatureRanges

TRAINED_ON = "2026-06-01"
# 10,000 transactions a day: enough rows for the drift check to judge (MIN_DRIFT_ROWS).
SCALE = 0.1


@pytest.fixture(scope="module")
def fraud(tmp_path_factory) -> dict:
    """A data root with a fraud model trained on one labelled day; each test lands its own."""
    world = trained_fraud_world(tmp_path_factory.mktemp("guard") / "data", TRAINED_ON, SCALE)
    return {**world, "days": iter(range(2, 29))}


def _land(fraud: dict, change) -> tuple[str, pa.Table]:
    """A new day like the training day (same volume: merchant reach and account activity grow
    with it, and the drift check rightly warns on a day much busier than training), changed."""
    store, date = fraud["store"], f"2026-06-{next(fraud['days']):02d}"
    generate_day(store, date, scale=SCALE)  # the same population (seed) as training, another day
    table = change(store.read_landing(TRANSACTIONS, date, TRANSACTIONS_SCHEMA))
    store.write_landing(TRANSACTIONS, date, table)
    return date, table


def _score(fraud: dict, date: str, max_quarantine_rate: float = 0.01):
    config = {"config": {"max_quarantine_rate": max_quarantine_rate}}
    with DagsterInstance.ephemeral() as instance:
        return materialize(
            [transactions, fraud_scores],
            partition_key=date,
            resources=fraud["resources"],
            instance=instance,
            raise_on_error=False,
            run_config={"ops": {"transactions": config, "fraud_scores": config}},
        )


def _checks(result) -> dict:
    return {c.check_name: c for c in result.get_asset_check_evaluations()}


SWEEP = [10.0**k for k in range(2, 309)]  # 1e2 .. 1e308


def _sweep(table: pa.Table) -> pa.Table:
    amounts = table["amount"].to_pylist()
    amounts[: len(SWEEP)] = SWEEP
    return table.set_column(3, "amount", pa.array(amounts, pa.float64()))


def test_the_model_manifest_records_each_features_training_range(fraud) -> None:
    ranges = FeatureRanges.from_json(fraud["manifest"]["feature_ranges"])
    assert ranges.names == fraud["manifest"]["features"]
    for name in ranges.names:
        levels = ranges.quantiles[name]
        assert (
            levels == sorted(levels) and len(levels) == 7
        )  # min, 0.1%, 1%, median, 99%, 99.9%, max
    assert np.all(ranges.low <= ranges.high)


def test_an_amount_sweep_never_scores_an_extreme_amount_below_an_ordinary_one_unmarked(
    fraud,
) -> None:
    date, landed = _land(fraud, _sweep)
    result = _score(fraud, date, max_quarantine_rate=0.05)  # 302 of 10,000 above the ceiling

    assert result.success, [e.message for e in result.get_step_failure_events()]
    store = fraud["store"]
    scores = store.read_output("fraud_scores", date)
    held = store.read_output("fraud_scores_quarantine", date)
    meta = asset_metadata(result, "fraud_scores")
    assert meta["rows_in"] == landed.num_rows == scores.num_rows + held.num_rows
    sweep_ids = landed["transaction_id"].to_pylist()[: len(SWEEP)]
    amount_of = dict(zip(sweep_ids, SWEEP, strict=True))
    # Above the contract's ceiling: quarantined with the reason, never scored.
    ceiling = {t for t, a in amount_of.items() if a > AMOUNT_CEILING}
    held_ids = held.filter(pc.equal(held["reason"], "amount_above_ceiling"))["transaction_id"]
    assert set(held_ids.to_pylist()) == ceiling
    assert meta["quarantine_reasons"]["amount_above_ceiling"] == len(ceiling)
    # Scored: an amount far beyond every training amount is marked for review; an unmarked
    # extreme never scores below an ordinary transaction.
    ranges = FeatureRanges.from_json(fraud["manifest"]["feature_ranges"])
    j = ranges.names.index("log_amount")
    training_max = np.expm1(ranges.high[j])
    marked_above = np.expm1(ranges.high[j] + REVIEW_MARGIN * (ranges.high[j] - ranges.low[j]))
    scored = scores.filter(pc.is_in(scores["transaction_id"], value_set=pa.array(sweep_ids)))
    assert scored.num_rows == len(SWEEP) - len(ceiling)
    ordinary = scores.filter(
        pc.invert(pc.is_in(scores["transaction_id"], value_set=pa.array(sweep_ids)))
    )
    typical = float(np.median(ordinary["score"].to_numpy()))
    for row in scored.to_pylist():
        amount = amount_of[row["transaction_id"]]
        assert np.isfinite(row["score"])
        if amount > marked_above * 1.01:
            assert row["needs_review"], (amount, row)
        if not row["needs_review"] and amount >= 1e4:
            assert row["score"] >= typical, (amount, row)
    assert meta["needs_review"] == int(pc.sum(scores["needs_review"]).as_py())
    check = _checks(result)["features_within_training_range"]
    clamped = check.metadata["clamped_rows_per_feature"].value
    assert clamped.get("log_amount", 0) >= sum(
        1 for a in SWEEP if training_max * 1.01 < a <= AMOUNT_CEILING
    )


def test_one_ceiling_breach_is_quarantined_and_the_day_still_publishes(fraud) -> None:
    def breach(table: pa.Table) -> pa.Table:
        amounts = table["amount"].to_pylist()
        amounts[7] = 1e12
        return table.set_column(3, "amount", pa.array(amounts, pa.float64()))

    date, landed = _land(fraud, breach)
    result = _score(fraud, date)

    assert result.success
    held = fraud["store"].read_output("fraud_scores_quarantine", date)
    assert held.select(["transaction_id", "reason"]).to_pylist() == [
        {"transaction_id": landed["transaction_id"][7].as_py(), "reason": "amount_above_ceiling"}
    ]
    landing_check = _checks(result)["transaction_values_in_range"]
    assert not landing_check.passed and landing_check.severity.value == "WARN"


def test_a_day_whose_amounts_shifted_warns_of_drift_naming_the_feature(fraud) -> None:
    date, _ = _land(fraud, lambda t: t.set_column(3, "amount", pc.multiply(t["amount"], 30.0)))
    result = _score(fraud, date)

    assert result.success  # WARN checks never block
    checks = _checks(result)
    drift = checks["feature_drift_below_limit"]
    assert not drift.passed and drift.severity.value == "WARN"
    psi = drift.metadata["feature_psi"].value
    assert psi["log_amount"] > 0.25 and psi["hour_sin"] < 0.1
    review = checks["features_within_training_range"]
    assert not review.passed  # most amounts are now beyond training: clamped and marked
    assert asset_metadata(result, "fraud_scores")["needs_review"] > 0


def test_an_ordinary_day_passes_the_range_and_drift_checks(fraud) -> None:
    date, _ = _land(fraud, lambda t: t)
    result = _score(fraud, date)

    assert result.success
    checks = _checks(result)
    assert checks["feature_drift_below_limit"].passed, checks["feature_drift_below_limit"].metadata[
        "feature_psi"
    ]
    assert checks["features_within_training_range"].passed, checks[
        "features_within_training_range"
    ].metadata["clamped_rows_per_feature"]
