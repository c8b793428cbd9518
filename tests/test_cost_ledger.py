"""The cost ledger: a day interrupted once on spot and finished on on-demand, with no prices set.

The day's node-seconds, rework and dollars are read back from its materialisation and checked
against the ledger file's own attempts and the shipped g5.xlarge prices: they add up.
"""

import json
import os
import signal
import time

import numpy as np
import pyarrow as pa
import pytest
from dagster import AssetExecutionContext, MaterializeResult, asset, materialize
from helpers import cpu_resources

from assets.checkpointing import Input, Output, Sizes, Work, spot_safe
from assets.common import partition_dates, scoring_metadata
from assets.day_metadata import day_entries, day_metadata
from inference.ledger import PartitionLedger, ledger_path, sum_figures
from inference.shard_worker import ModelStep
from policy.partitions import daily_partitions
from policy.prices import (
    NODE_TYPE_SETTING,
    ON_DEMAND_PRICE_SETTING,
    SPOT_PRICE_SETTING,
    node_prices,
)
from policy.tags import CAPACITY_TAG, ON_DEMAND
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64())])
DAY = "2026-03-02"
ROWS, SHARD_ROWS, BATCH = 1000, 200, 100
# The first attempt is told to stop in the first batch of its third shard; it stops before
# the second, with one batch of that shard to redo.
KILL_AT = 400
PLAN: dict = {}


@asset(partitions_def=daily_partitions)
def tripled(
    context: AssetExecutionContext, storage: StorageResource, inference: InferenceResource
) -> MaterializeResult:
    """Triples 1,000 ids in shards of 200, each model call taking a few milliseconds."""
    store = storage.store()
    batches = [pa.record_batch({"id": np.arange(ROWS)})]

    def transform(batch: pa.RecordBatch, prepared) -> pa.Table:
        if batch["id"][0].as_py() == KILL_AT and PLAN.get("kill"):
            PLAN["kill"] = False
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.02)
        ids = batch["id"].to_numpy()
        return pa.table({"id": ids, "y": ids * 3.0})

    with spot_safe(context, store, inference) as run:
        for date in partition_dates(context):
            work = Work(
                Input(batches, files=[]), ModelStep(transform), Output(SCHEMA), "v1", Sizes(BATCH)
            )
            report = run.partition("tripled", date, work)
            metadata = scoring_metadata(report, model_version="v1", device="cpu", model_loads=0)
    return MaterializeResult(metadata=day_metadata({**metadata, **run.metadata()}))


@pytest.fixture(autouse=True)
def no_prices(monkeypatch: pytest.MonkeyPatch):
    for setting in (NODE_TYPE_SETTING, SPOT_PRICE_SETTING, ON_DEMAND_PRICE_SETTING):
        monkeypatch.delenv(setting, raising=False)
    yield
    PLAN.clear()


def _materialize(data_root, instance, tags=None, partition_key=DAY):
    resources = cpu_resources(data_root, shard_rows=SHARD_ROWS)
    return materialize(
        [tripled],
        partition_key=partition_key,
        resources=resources,
        instance=instance,
        raise_on_error=False,
        tags=tags or {},
    )


def _ledger(store: DataStore, date: str = DAY) -> PartitionLedger:
    path = ledger_path(store.partition_target("tripled", date))
    return PartitionLedger.from_json(json.loads(open(path).read()))


def test_interrupted_day_adds_up_over_its_attempts(data_root, store, instance) -> None:
    PLAN["kill"] = True
    first = _materialize(data_root, instance)
    assert not first.success
    interrupted = _ledger(store)
    [spot] = interrupted.attempts
    assert spot.interrupted and spot.capacity == "spot" and not interrupted.committed
    assert spot.rows == 2 * SHARD_ROWS  # two shards finished before the stop

    # The retry lands on on-demand capacity (the tag the interruption path would set).
    second = _materialize(data_root, instance, tags={CAPACITY_TAG: ON_DEMAND})
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
    result = _materialize(data_root, instance)
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
    assert _materialize(data_root, instance).success
    before = _ledger(store)
    assert _materialize(data_root, instance).success
    after = _ledger(store)
    assert len(after.attempts) == 1 and after.attempts[0].run_id != before.attempts[0].run_id


def test_a_range_run_sums_its_days(data_root, store, instance) -> None:
    tags = {
        "dagster/asset_partition_range_start": "2026-03-01",
        "dagster/asset_partition_range_end": DAY,
    }
    result = _materialize(data_root, instance, tags=tags, partition_key=None)
    assert result.success
    days = [_ledger(store, day).figures(node_prices("g5.xlarge")) for day in ("2026-03-01", DAY)]
    total = sum_figures(days)
    assert total["node_s_spot"] == pytest.approx(days[0]["node_s_spot"] + days[1]["node_s_spot"])
    logs = [e.message for e in instance.all_logs(result.run_id) if e.message]
    [line] = [m for m in logs if m.startswith("2 days: $")]
    assert line.startswith(f"2 days: ${total['cost_usd']:.4f} at g5.xlarge prices")
    assert f"{total['node_s_spot']:.1f} node-s on spot" in line
