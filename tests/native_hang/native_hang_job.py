"""A day whose model call can hang: the job that tests/test_native_hang.py runs through
`dagster job execute`. ``NIGHTSHIFT_TEST_HANG=gil`` makes the call at id ``STUCK_AT`` sleep in
libc through ``ctypes.PyDLL``, which never lets go of the interpreter; ``python`` makes it loop
in Python for ever."""

import ctypes
import os
import time

import numpy as np
import pyarrow as pa
from dagster import AssetExecutionContext, Definitions, MaterializeResult, asset, define_asset_job

from assets.checkpointing import spot_safe
from assets.partitions import partition_dates
from assets.runner import scoring_metadata
from inference.engine.shard_worker import ModelStep
from inference.engine.work import Input, Output, Sizes, Work
from orchestration.executor import leave_on_interruption_executor
from orchestration.resources import build_resources
from policy.partitions import daily_partitions
from policy.retries import ERROR_RETRY_POLICY, INTERRUPTION_RETRY_TAGS
from resources.inference import InferenceResource
from resources.storage import StorageResource

SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64())])
DAY = "2026-03-02"
ROWS, SHARD_ROWS, BATCH = 1000, 200, 100
# The stuck call: the second batch of the third shard (shards 0 and 1 are finished by then).
STUCK_AT = 500


def _hold_the_interpreter() -> None:
    libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the interpreter for its whole length
    while True:
        libc.sleep(3600)


def _loop_in_python() -> None:
    while True:
        time.sleep(0.01)


HANGS = {"gil": _hold_the_interpreter, "python": _loop_in_python}


@asset(partitions_def=daily_partitions)
def doubled(
    context: AssetExecutionContext, storage: StorageResource, inference: InferenceResource
) -> MaterializeResult:
    """Doubles 1,000 ids in shards of 200; told so, one model call hangs for ever."""
    store = storage.store()
    hang = HANGS.get(os.environ.get("NIGHTSHIFT_TEST_HANG", ""))

    def transform(batch: pa.RecordBatch, prepared) -> pa.Table:
        if hang is not None and batch["id"][0].as_py() == STUCK_AT:
            hang()
        ids = batch["id"].to_numpy()
        return pa.table({"id": ids, "y": ids * 2.0})

    with spot_safe(context, store, inference) as run:
        [date] = partition_dates(context)
        batches = [pa.record_batch({"id": np.arange(ROWS)})]
        work = Work(
            Input(batches, files=[]), ModelStep(transform), Output(SCHEMA), "v1", Sizes(BATCH)
        )
        report = run.partition("doubled", date, work)
    metadata = scoring_metadata(report, model_version="v1", device="cpu", model_loads=0)
    return MaterializeResult(metadata={**metadata, **run.metadata()})


# As the pipeline jobs run (orchestration/jobs.py): the step in the run's own process.
doubled_job = define_asset_job(
    "doubled_job",
    selection=[doubled],
    partitions_def=daily_partitions,
    op_retry_policy=ERROR_RETRY_POLICY,
    executor_def=leave_on_interruption_executor,
    tags=INTERRUPTION_RETRY_TAGS,
)
# The local environment's resources: the data root and the stall settings from the test's
# environment variables.
defs = Definitions(assets=[doubled], jobs=[doubled_job], resources=build_resources("local"))
