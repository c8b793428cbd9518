"""An asset that triples 1,000 ids in checkpointed shards and can be told to stop part way: the
day the cost ledger and the deadline tests interrupt and resume. A conftest plugin, so that
``no_prices`` is requested by name."""

import os
import signal
import time

import numpy as np
import pyarrow as pa
import pytest
from dagster import AssetExecutionContext, MaterializeResult, asset, materialize
from helpers import cpu_resources

from assets.checkpointing import spot_safe
from assets.day_metadata import day_metadata
from assets.partitions import partition_dates
from assets.runner import scoring_metadata
from inference.engine.shard_worker import ModelStep
from inference.engine.work import Input, Output, Sizes, Work
from policy.partitions import daily_partitions
from policy.prices import NODE_TYPE_SETTING, ON_DEMAND_PRICE_SETTING, SPOT_PRICE_SETTING
from resources.inference import InferenceResource
from resources.storage import StorageResource

SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64())])
DAY = "2026-03-02"
ROWS, SHARD_ROWS, BATCH = 1000, 200, 100
# The first attempt is told to stop in the first batch of its third shard; it stops before
# the second, with one batch of that shard to redo.
KILL_AT = 400
# ``kill``: True, or the one day to stop in; ``load_s``: seconds of a model load before the
# first day, through the inference resource as the runner's.
PLAN: dict = {}


@asset(partitions_def=daily_partitions)
def tripled(
    context: AssetExecutionContext, storage: StorageResource, inference: InferenceResource
) -> MaterializeResult:
    """Triples 1,000 ids in shards of 200, each model call taking a few milliseconds."""
    store = storage.store()
    batches = [pa.record_batch({"id": np.arange(ROWS)})]
    if "load_s" in PLAN:
        inference.model("tripled", lambda runtime: time.sleep(PLAN["load_s"]))

    def tripler(date: str):
        def transform(batch: pa.RecordBatch, prepared) -> pa.Table:
            if batch["id"][0].as_py() == KILL_AT and PLAN.get("kill") in (True, date):
                PLAN["kill"] = False
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.02)
            ids = batch["id"].to_numpy()
            return pa.table({"id": ids, "y": ids * 3.0})

        return transform

    with spot_safe(context, store, inference) as run:
        for date in partition_dates(context):
            step = ModelStep(tripler(date))
            work = Work(Input(batches, files=[]), step, Output(SCHEMA), "v1", Sizes(BATCH))
            report = run.partition("tripled", date, work)
            metadata = scoring_metadata(report, model_version="v1", device="cpu", model_loads=0)
    return MaterializeResult(metadata=day_metadata({**metadata, **run.metadata()}))


@pytest.fixture
def no_prices(monkeypatch: pytest.MonkeyPatch):
    """No node type or prices from the environment (the shipped table's g5.xlarge decides), and
    no stop planned once the test is done."""
    for setting in (NODE_TYPE_SETTING, SPOT_PRICE_SETTING, ON_DEMAND_PRICE_SETTING):
        monkeypatch.delenv(setting, raising=False)
    yield
    PLAN.clear()


def materialize_tripled(data_root, instance, tags=None, partition_key=DAY):
    """Materialises ``tripled`` in shards of 200 rows; a failed run is returned, not raised."""
    resources = cpu_resources(data_root, shard_rows=SHARD_ROWS)
    return materialize(
        [tripled],
        partition_key=partition_key,
        resources=resources,
        instance=instance,
        raise_on_error=False,
        tags=tags or {},
    )
