"""A day the tests make hang, wait or die in: 1,000 ids doubled by the engine in shards (the
run's shard size), each model call first handed to the test's ``before``, scored through the
scoring steps' own spot-safe run and reported with their metadata."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
from dagster import AssetExecutionContext, MaterializeResult

from assets.checkpointing import spot_safe
from assets.partitions import partition_dates
from assets.runner import scoring_metadata
from inference.engine.shard_worker import ModelStep
from inference.engine.work import Input, Output, Sizes, Work
from resources.inference import InferenceResource
from resources.storage import StorageResource

SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64())])
ROWS, BATCH = 1000, 100


def double_day(
    context: AssetExecutionContext,
    storage: StorageResource,
    inference: InferenceResource,
    before: Callable[[pa.RecordBatch], None] | None = None,
) -> MaterializeResult:
    """Scores the asset's day: ``y`` is twice ``id``; ``before`` sees each model call's batch."""
    store = storage.store()

    def transform(batch: pa.RecordBatch, prepared) -> pa.Table:
        if before is not None:
            before(batch)
        ids = batch["id"].to_numpy()
        return pa.table({"id": ids, "y": ids * 2.0})

    with spot_safe(context, store, inference) as run:
        [date] = partition_dates(context)
        batches = [pa.record_batch({"id": np.arange(ROWS)})]
        work = Work(
            Input(batches, files=[]), ModelStep(transform), Output(SCHEMA), "v1", Sizes(BATCH)
        )
        report = run.partition(context.asset_key.to_user_string(), date, work)
    metadata = scoring_metadata(report, model_version="v1", device="cpu", model_loads=0)
    return MaterializeResult(metadata={**metadata, **run.metadata()})
