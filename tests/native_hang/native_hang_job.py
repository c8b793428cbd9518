"""A day whose model call can hang: the job that tests/test_native_hang.py runs through
`dagster job execute`. ``NIGHTSHIFT_TEST_HANG=gil`` makes the call at id ``STUCK_AT`` sleep in
libc through ``ctypes.PyDLL``, which never lets go of the interpreter; ``python`` makes it loop
in Python for ever."""

import ctypes
import os
import time

import pyarrow as pa
from dagster import AssetExecutionContext, Definitions, MaterializeResult, asset, define_asset_job
from doubled_world import double_day

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
    hang = HANGS.get(os.environ.get("NIGHTSHIFT_TEST_HANG", ""))

    def before(batch: pa.RecordBatch) -> None:
        if hang is not None and batch["id"][0].as_py() == STUCK_AT:
            hang()

    return double_day(context, storage, inference, before)


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
