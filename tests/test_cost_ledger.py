"""The cost ledger: a day interrupted once on spot and finished on on-demand, with no prices set.

The day's node-seconds, rework and dollars are read back from its materialisation and checked
against the ledger file's own attempts and the shipped g5.xlarge prices: they add up. The day
is tests/tripled_world.py's.
"""

import json

import pytest
from tripled_world import BATCH, DAY, KILL_AT, PLAN, ROWS, SHARD_ROWS, materialize_tripled

from assets.day_metadata import day_entries
from inference.engine.ledger import PartitionLedger, ledger_path, sum_figures
from policy.prices import node_prices
from policy.tags import CAPACITY_TAG, ON_DEMAND
from resources.storage import DataStore

pytestmark = pytest.mark.usefixtures("no_prices")


def _ledger(store: DataStore, date: str = DAY) -> PartitionLedger:
    path = ledger_path(store.partition_target("tripled", date))
    return PartitionLedger.from_json(json.loads(open(path).read()))


def test_interrupted_day_adds_up_over_its_attempts(data_root, store, instance) -> None:
    PLAN["kill"] = True
    first = materialize_tripled(data_root, instance)
    assert not first.success
    interrupted = _ledger(store)
    [spot] = interrupted.attempts
    assert spot.interrupted and spot.capacity == "spot" and not interrupted.committed
    assert spot.rows == 2 * SHARD_ROWS  # two shards finished before the stop

    # The retry lands on on-demand capacity (the tag the interruption path would set).
    second = materialize_tripled(data_root, instance, tags={CAPACITY_TAG: ON_DEMAND})
    assert second.success
    [mat] = second.asset_materializations_for_node("tripled")
    meta = {k: v.value for k, v in day_entries(mat.metadata).items()}
    assert store.read_output("tripled", DAY)["y"].to_pylist() == [3.0 * i for i in range(ROWS)]

    ledger = _ledger(store)
    assert ledger.committed and ledger.rows_total == ROWS
    first_attempt, retry = ledger.attempts
    assert first_attempt == spot and retry.capacity == "on_demand" and not retry.interrupted
    # The stopped shard's rows computed before the stop are the rows the retry redid.
    assert retry.rows == ROWS - 2 * SHARD_ROWS
    assert retry.rows_redone == meta["rows_redone"] == KILL_AT + BATCH - 2 * SHARD_ROWS

    # Node-seconds: each attempt from its launch (the run's start) to its end, per capacity.
    assert meta["node_s_spot"] == pytest.approx(spot.ended - spot.started, abs=1e-3)
    assert meta["node_s_on_demand"] == pytest.approx(retry.ended - retry.started, abs=1e-3)
    assert spot.node_s > spot.work_s > 5 * 0.02  # scored 5 batches of 20 ms
    # Rework: the redone rows at the retry's own rate, plus the retry's launch-to-first-shard.
    redo = retry.work_s * retry.rows_redone / retry.rows
    assert meta["rework_s"] == pytest.approx(redo + retry.overhead_s, abs=1e-3)
    assert 0 < meta["rework_s"] < meta["node_s_on_demand"]

    # Dollars at the shipped g5.xlarge prices, no price set anywhere.
    prices = node_prices("g5.xlarge")
    spot_rate, od_rate = prices.spot_per_hour / 3600, prices.on_demand_per_hour / 3600
    assert meta["cost_basis"] == "at g5.xlarge prices"
    cost = spot.node_s * spot_rate + retry.node_s * od_rate
    assert meta["cost_usd"] == pytest.approx(cost, abs=1e-6)
    assert meta["cost_on_demand_usd"] == pytest.approx(
        (spot.node_s + retry.node_s) * od_rate, abs=1e-6
    )
    assert meta["cost_rework_usd"] == pytest.approx((redo + retry.overhead_s) * od_rate, abs=1e-6)
    all_on_demand = (spot.node_s + retry.node_s) * od_rate
    saving = 100 * (all_on_demand - cost) / all_on_demand
    assert meta["saving_pct"] == pytest.approx(saving, abs=0.05)
    assert 0 < meta["saving_pct"] < 100 * (1 - prices.spot_per_hour / prices.on_demand_per_hour)
    # The day's cost is a plotted series (a top-level number), the rest sit in the detail table.
    assert mat.metadata["cost_usd"].value == meta["cost_usd"]
    assert "node_s_spot" not in mat.metadata and "rework_s" not in mat.metadata


def test_an_uninterrupted_spot_day_saves_the_table_rate(data_root, store, instance) -> None:
    result = materialize_tripled(data_root, instance)
    assert result.success
    [mat] = result.asset_materializations_for_node("tripled")
    meta = {k: v.value for k, v in day_entries(mat.metadata).items()}
    prices = node_prices("g5.xlarge")
    [attempt] = _ledger(store).attempts
    assert meta["node_s_on_demand"] == 0 and meta["rework_s"] == 0
    assert meta["node_s_spot"] == pytest.approx(attempt.node_s, abs=1e-3)
    assert meta["saving_pct"] == round(
        100 * (1 - prices.spot_per_hour / prices.on_demand_per_hour), 1
    )


def test_a_new_scoring_of_a_committed_day_opens_a_new_ledger(data_root, store, instance) -> None:
    assert materialize_tripled(data_root, instance).success
    before = _ledger(store)
    assert materialize_tripled(data_root, instance).success
    after = _ledger(store)
    assert len(after.attempts) == 1 and after.attempts[0].run_id != before.attempts[0].run_id


def test_a_range_run_sums_its_days(data_root, store, instance) -> None:
    tags = {
        "dagster/asset_partition_range_start": "2026-03-01",
        "dagster/asset_partition_range_end": DAY,
    }
    result = materialize_tripled(data_root, instance, tags=tags, partition_key=None)
    assert result.success
    days = [_ledger(store, day).figures(node_prices("g5.xlarge")) for day in ("2026-03-01", DAY)]
    total = sum_figures(days)
    assert total["node_s_spot"] == pytest.approx(days[0]["node_s_spot"] + days[1]["node_s_spot"])
    logs = [e.message for e in instance.all_logs(result.run_id) if e.message]
    [line] = [m for m in logs if m.startswith("2 days: $")]
    assert line.startswith(f"2 days: ${total['cost_usd']:.4f} at g5.xlarge prices")
    assert f"{total['node_s_spot']:.1f} node-s on spot" in line
