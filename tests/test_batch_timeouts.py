"""Per-call deadlines: a batch twenty times slower than the others is stopped, tried again, then
split, and the day publishes a clean run's output exactly once with the timeouts counted; off,
the day waits for it; a row that is slow alone fails the step with a message naming its shard."""

import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from dagster import AssetExecutionContext, MaterializeResult, asset, materialize
from helpers import asset_metadata, cpu_resources
from ray_world import local_ray

from assets.checkpointing import spot_safe
from assets.partitions import partition_dates
from assets.runner import scoring_metadata
from inference.engine.batch_timeout import MIN_CALLS, BatchTimedOut, BatchTimeout, CallClock
from inference.engine.shard_worker import ModelStep, ShardJob
from inference.engine.shard_writer import ShardedWriter, ShardFileTargets
from inference.engine.shards import Watch, row_range_shards, run_partition
from inference.engine.watchdog import StallLimit
from inference.engine.work import Input, Output, Sizes, Work
from policy.partitions import daily_partitions
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64())])
DAY = "2026-03-02"
ROWS, SHARD_ROWS, BATCH = 2000, 1000, 100
# A row whose call is slow: in shard 1's fifth call, after the shard has a median.
SLOW_ROW = 1450
ROW_SECONDS = 0.001  # what a row costs a model call: a call of 100 rows takes 0.1 s
SLOWER = 20
# Deadlines of 4x the shard's median call: 0.4 s for the 0.1 s calls, so the slow call (2 s)
# is stopped; halves are slow until a part of 12 rows or fewer holds the slow row.
TIMEOUT = {"batch_timeout_multiple": 4.0, "batch_timeout_floor_seconds": 0.2}
OFF = {"batch_timeout_multiple": 0.0}
# A progress watchdog tighter than the slow call's retries and splits together, looser than two
# deadlines: each timeout and each part scored tells it the shard still moves.
STALL = {"stall_floor_seconds": 1.5, "stall_ceiling_seconds": 60.0, "stall_batch_multiple": 8.0}
PLAN: dict = {}  # "slow": "padded" (a call's rows all wait for the slow one), "alone" or None


def _wait(seconds: float) -> None:
    """Sleeps in short slices, as a Python-level wait does (a deadline stops it between)."""
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        time.sleep(min(left, 0.005))


@asset(partitions_def=daily_partitions)
def padded(
    context: AssetExecutionContext, storage: StorageResource, inference: InferenceResource
) -> MaterializeResult:
    """Doubles 2,000 ids; one call is slow as the test plan says."""
    store = storage.store()
    slow = PLAN.get("slow")

    def transform(batch: pa.RecordBatch, prepared) -> pa.Table:
        ids = batch["id"].to_numpy()
        if slow == "padded" and SLOW_ROW in ids:
            # Every row of the call is padded to the slow one, as texts are to the longest.
            _wait(len(ids) * ROW_SECONDS * SLOWER)
        elif slow == "alone" and SLOW_ROW in ids:
            _wait(ROWS * ROW_SECONDS)  # slow whatever the call's size
        else:
            _wait(len(ids) * ROW_SECONDS)
        return pa.table({"id": ids, "y": ids * 2.0})

    with spot_safe(context, store, inference) as run:
        [date] = partition_dates(context)
        batches = [pa.record_batch({"id": np.arange(ROWS)})]
        sizes = Sizes(BATCH, batch_timeout_multiple=PLAN.get("spec_multiple"))
        work = Work(Input(batches, files=[]), ModelStep(transform), Output(SCHEMA), "v1", sizes)
        report = run.partition("padded", date, work)
    metadata = scoring_metadata(report, model_version="v1", device="cpu", model_loads=0)
    return MaterializeResult(metadata={**metadata, **run.metadata()})


def _materialize(data_root, instance, slow: str | None, spec_multiple=None, **settings):
    PLAN.update(slow=slow, spec_multiple=spec_multiple)
    resources = cpu_resources(data_root, shard_rows=SHARD_ROWS, **settings)
    return materialize(
        [padded], partition_key=DAY, resources=resources, instance=instance, raise_on_error=False
    )


def _clean_output(tmp_path, instance) -> pa.Table:
    """The day as a run with no slow call publishes it, in a data root of its own."""
    root = tmp_path / "clean"
    root.mkdir()
    result = _materialize(root, instance, slow=None, **OFF)
    assert result.success
    assert asset_metadata(result, "padded")["batch_timeouts"] == 0
    return DataStore(str(root)).read_output("padded", DAY).sort_by("id")


def _published_once(store: DataStore) -> pa.Table:
    published = store.read_output("padded", DAY).sort_by("id")
    assert published.column("id").to_pylist() == list(range(ROWS))
    return published


@pytest.mark.parametrize(
    ("settings", "spec_multiple"),
    [
        ({**TIMEOUT, **STALL}, None),
        ({**TIMEOUT, **STALL, **OFF}, TIMEOUT["batch_timeout_multiple"]),
    ],
    ids=["the-resource-setting", "the-spec-setting"],
)
def test_a_batch_twenty_times_slower_is_timed_out_split_and_the_day_equals_a_clean_run(
    settings, spec_multiple, data_root, store, instance, tmp_path
) -> None:
    result = _materialize(data_root, instance, "padded", spec_multiple, **settings)
    assert result.success
    meta = asset_metadata(result, "padded")
    # The slow call timed out twice at its full size, then was split; each split is one more
    # call than the clean run's twenty.
    assert meta["batch_timeouts"] >= 2 and meta["batch_splits"] >= 1
    assert meta["batch_count"] >= ROWS // BATCH + meta["batch_splits"]
    assert meta["rows_out"] == ROWS and meta["stalls"] == 0 and meta["interruptions"] == 0
    assert _published_once(store).equals(_clean_output(tmp_path, instance))


def test_with_deadlines_off_the_slow_batch_is_waited_for(
    data_root, store, instance, tmp_path
) -> None:
    result = _materialize(data_root, instance, "padded", **OFF)
    assert result.success
    meta = asset_metadata(result, "padded")
    assert meta["batch_timeouts"] == 0 and meta["batch_splits"] == 0
    assert meta["batch_count"] == ROWS // BATCH
    assert _published_once(store).equals(_clean_output(tmp_path, instance))


def test_a_row_slow_alone_fails_the_step_naming_its_shard(data_root, store, instance) -> None:
    result = _materialize(data_root, instance, "alone", **TIMEOUT)
    assert not result.success
    [failure] = result.get_step_failure_events()
    error = failure.step_failure_data.error.cause
    message = error.message
    assert error.cls_name == "BatchTimeoutError"
    assert "a model call of a single row (shard 1) ran past its deadline of" in message
    assert "4x the shard's median call) twice" in message
    assert not store.output_exists("padded", DAY)


@pytest.mark.parametrize(
    ("timeout", "calls", "expected"),
    [
        (BatchTimeout(), [1.0] * 10, None),  # off by default
        (BatchTimeout(4.0, 0.2), [0.1] * (MIN_CALLS - 1), None),  # too few calls yet
        (BatchTimeout(4.0, 0.2), [0.1, 0.1, 5.0], 0.4),  # the median, not the mean
        (BatchTimeout(4.0, 1.0), [0.1] * 5, 1.0),  # the floor
    ],
)
def test_the_deadline_is_a_multiple_of_the_shards_median_call(timeout, calls, expected) -> None:
    assert timeout.deadline(calls) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"multiple": 0.5}, "batch timeout multiple must be 0 (off) or above 1, got 0.5"),
        ({"multiple": 3, "floor": 0}, "batch timeout floor must be > 0 seconds, got 0"),
    ],
)
def test_bad_batch_timeout_settings_are_a_clear_error(settings, says) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        BatchTimeout(**settings)


def test_the_settings_come_from_the_environment(monkeypatch) -> None:
    from orchestration.resources import engine_overrides

    monkeypatch.setenv("NIGHTSHIFT_BATCH_TIMEOUT_MULTIPLE", "10")
    monkeypatch.setenv("NIGHTSHIFT_BATCH_TIMEOUT_FLOOR_SECONDS", "30")
    timeout = InferenceResource(**engine_overrides()).batch_timeout()
    assert timeout == BatchTimeout(multiple=10.0, floor=30.0)


def test_the_clock_stops_a_call_past_its_deadline_and_no_other() -> None:
    clock = CallClock()
    try:
        # Calls that finish in time return, and nothing is raised after them.
        for _ in range(20):
            assert clock.call(lambda: 7, seconds=0.05) == 7
        _wait(0.2)
        with pytest.raises(BatchTimedOut):
            clock.call(lambda: _wait(30.0), seconds=0.1)
        assert clock.call(lambda: "after", seconds=None) == "after"
        _wait(0.2)
    finally:
        clock.close()
    deadline = time.monotonic() + 10
    while _clock_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _clock_threads() == []  # closed, its monitor thread ends


# A thread that a timeout fired at, in a process that profiles its next call: the error left
# pending must not leave the interpreter's "error pending" flag set, which makes CPython 3.11
# spin for ever on a profiled call (found when tests/test_day_route.py hung after this file).
AFTER_A_TIMEOUT = """
import sys, time
from inference.engine.batch_timeout import BatchTimedOut, CallClock
from inference.engine.watchdog import forget_raised

def slow():
    until = time.monotonic() + 30
    while time.monotonic() < until:
        time.sleep(0.005)

clock = CallClock()
for _ in range(3):
    try:
        clock.call(slow, seconds=0.05)
    except BatchTimedOut:
        pass
    forget_raised()  # twice over, and with nothing pending
clock.close()
sys.setprofile(lambda *args: None)
print(sum(abs(n) for n in range(10)))
sys.setprofile(None)
"""


def test_a_profiled_call_after_a_timeout_returns() -> None:
    done = subprocess.run(
        [sys.executable, "-c", AFTER_A_TIMEOUT],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "45"


def _clock_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nightshift-batch-clock"]


# -- on Ray: the deadline is kept in the worker process, by the worker's own clock thread ------


@pytest.fixture(scope="module")
def ray():
    yield from local_ray(sys.modules[__name__])


@dataclass(frozen=True)
class PaddedAt:
    """Doubles ids; a call holding row ``slow`` costs each of its rows twenty times more."""

    slow: int

    def __call__(self, rows: pa.Table) -> ModelStep:
        def transform(batch: pa.RecordBatch, prepared) -> pa.Table:
            ids = batch["id"].to_numpy()
            _wait(len(ids) * ROW_SECONDS * (SLOWER if self.slow in ids else 1))
            return pa.table({"id": ids, "y": ids * 2.0})

        return ModelStep(transform)


def test_on_ray_the_worker_times_out_and_splits_the_slow_batch(ray, store) -> None:
    from inference.engine.ray_pool import RayPool

    writer = ShardedWriter(
        ShardFileTargets(store.partition_target("out", DAY), SCHEMA), "fp", SHARD_ROWS, "run-a"
    )
    timeout = BatchTimeout(
        TIMEOUT["batch_timeout_multiple"], TIMEOUT["batch_timeout_floor_seconds"]
    )
    job = ShardJob(writer.files(), PaddedAt(SLOW_ROW), BATCH, batch_timeout=timeout)
    pool = RayPool(ray, workers=2, cpus_per_worker=1, gpus_per_worker=0)
    try:
        # The ceiling covers the actors' start (a torch import each) on a busy machine.
        watch = Watch(watchdog=pool.watchdog(StallLimit(floor=3.0, ceiling=120.0)))
        report = run_partition(
            writer,
            lambda: row_range_shards([pa.record_batch({"id": np.arange(ROWS)})], SHARD_ROWS),
            job,
            pool,
            watch,
        )
    finally:
        pool.close()
    assert watch.metrics.batch_timeouts >= 2 and watch.metrics.batch_splits >= 1
    assert report.stalls == 0 and report.rows_out == ROWS
    out = store.read_output("out", DAY).sort_by("id")
    assert out["id"].to_pylist() == list(range(ROWS))
    assert out["y"].to_pylist() == [2.0 * i for i in range(ROWS)]
