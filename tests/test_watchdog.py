"""The progress watchdog: a model call that never returns (in Python, or in native code) fails
the step for a retry within the day's stall limit, keeps the finished shards, and the retry
publishes the output of a clean run exactly once; the time lost reaches the capacity policy."""

import ctypes
import datetime as dt
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest
from dagster import AssetExecutionContext, MaterializeResult, asset, materialize
from doubled_world import double_day
from helpers import asset_metadata, cpu_resources
from ray_world import local_ray, started_shards

from inference.engine.ledger import LedgerBook
from inference.engine.ray_pool import BEAT_SECONDS
from inference.engine.shard_worker import ModelStep, ShardJob
from inference.engine.shard_writer import ShardedWriter, ShardFileTargets
from inference.engine.shards import WAIT_SECONDS, Stalled, Watch, row_range_shards, run_partition
from inference.engine.watchdog import Heartbeat, StallLimit, Watchdog
from policy.partitions import daily_partitions
from policy.ready_by import NightFacts, ReadyBy, deadline_decision
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64())])
DAY = "2026-03-02"
ROWS, SHARD_ROWS, BATCH = 1000, 200, 100
# The stuck call: the second batch of the third shard (shards 0 and 1 are finished by then).
STUCK_AT = 500
# Small limits keep the test fast; the batches take milliseconds, so the limit derived from
# them is the floor, and a shard's files are written well within it.
STALL = {"stall_floor_seconds": 3.0, "stall_ceiling_seconds": 6.0, "stall_batch_multiple": 20.0}
PLAN: dict = {}  # how the next attempt's stuck call hangs: "python", "native" or nothing


def _hang_in_python() -> None:
    while True:  # a model call that never returns, in Python
        time.sleep(0.01)


def _hang_in_native_code() -> None:
    # A read of a pipe nobody writes to, in libc through ctypes: native code that lets go of
    # the interpreter and never returns on its own (the test's teardown writes the byte).
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(1)
    libc.read(PLAN["pipe"][0], buffer, 1)


HANGS = {"python": _hang_in_python, "native": _hang_in_native_code}


@asset(partitions_def=daily_partitions)
def doubled(
    context: AssetExecutionContext, storage: StorageResource, inference: InferenceResource
) -> MaterializeResult:
    """Doubles 1,000 ids in shards of 200; the test plan makes one model call hang."""
    hang = HANGS.get(PLAN.get("hang", ""))
    PLAN["hang"] = None  # the retry runs clean

    def before(batch: pa.RecordBatch) -> None:
        if hang is not None and batch["id"][0].as_py() == STUCK_AT:
            hang()

    return double_day(context, storage, inference, before)


def _materialize(data_root, instance):
    resources = cpu_resources(data_root, shard_rows=SHARD_ROWS, **STALL)
    return materialize(
        [doubled], partition_key=DAY, resources=resources, instance=instance, raise_on_error=False
    )


@pytest.fixture
def stuck_pipe() -> Iterator[None]:
    """The pipe the native hang reads; written at the end, so the stuck thread returns."""
    PLAN["pipe"] = os.pipe()
    yield
    read, write = PLAN.pop("pipe")
    os.write(write, b"x")
    os.close(write)
    time.sleep(0.1)  # the stuck read returns before its file is closed
    os.close(read)


def _clean_output(tmp_path, instance) -> pa.Table:
    """The day as a run that never stalled publishes it, in a data root of its own."""
    root = tmp_path / "clean"
    root.mkdir()
    PLAN["hang"] = None
    assert _materialize(root, instance).success
    return DataStore(str(root)).read_output("doubled", DAY)


@pytest.mark.parametrize("hang", ["python", "native"])
def test_a_stuck_model_call_fails_the_step_for_a_retry_that_resumes_exactly_once(
    hang, data_root, store, instance, tmp_path, stuck_pipe
) -> None:
    PLAN["hang"] = hang
    started = time.monotonic()
    result = _materialize(data_root, instance)
    elapsed = time.monotonic() - started
    assert not result.success
    # The limit the settings give these batches (milliseconds each) is the floor: the step
    # failed once the stuck call had waited that long, not before and not much after (the
    # driver asks the watchdog between waits of WAIT_SECONDS). Not a speed figure: a step
    # that hangs never gets here, and one that waited the ceiling would fail the second bound.
    limit = STALL["stall_floor_seconds"]
    [failure] = result.get_step_failure_events()
    message = failure.step_failure_data.error.message
    assert "stalled: no model call finished for " in message
    assert "in shard 2 after its batch 1 (limit 3.0 s: the floor;" in message
    assert "2 finished shards kept and the stuck shard's 200 rows will be redone" in message
    assert "will be relaunched and resume from the checkpoint" in message
    figures = {k: v.value for k, v in failure.step_failure_data.user_failure_data.metadata.items()}
    assert figures["stall_shard"] == 2 and figures["stall_batches_done"] == 1
    assert figures["stall_limit_s"] == limit
    assert limit <= figures["stall_waited_s"] <= limit + 4 * WAIT_SECONDS + 1.0
    assert elapsed < STALL["stall_ceiling_seconds"] + 60.0
    tags = instance.get_run_by_id(result.run_id).tags
    assert tags["nightshift/interrupted"] == "true" and tags["nightshift/interruptions"] == "1"
    assert tags["dagster/retry_on_asset_or_op_failure"] == "true"

    # The run's retry, as the daemon launches it (the failed run's tags), resumes from the two
    # finished shards and publishes the day a clean run publishes, each row once.
    retry = materialize(
        [doubled],
        partition_key=DAY,
        resources=cpu_resources(data_root, shard_rows=SHARD_ROWS, **STALL),
        instance=instance,
        tags={k: v for k, v in tags.items() if k.startswith(("nightshift/", "dagster/retry"))},
    )
    assert retry.success
    meta = asset_metadata(retry, "doubled")
    assert meta["shards_resumed"] == 2 and meta["rows_out"] == ROWS
    assert meta["interruptions"] == 1 and meta["stalls"] == 1
    published = store.read_output("doubled", DAY).sort_by("id")
    assert published.column("id").to_pylist() == sorted(set(published.column("id").to_pylist()))
    assert published.equals(_clean_output(tmp_path, instance).sort_by("id"))


def test_the_stuck_python_call_is_stopped_and_native_code_is_left_behind(
    data_root, instance, stuck_pipe
) -> None:
    """Python code that is stuck is stopped where it loops; native code cannot be, and its
    thread waits, abandoned, until its call returns (then it stops too)."""
    PLAN["hang"] = "python"
    assert not _materialize(data_root, instance).success
    deadline = time.monotonic() + 30
    while _scoring_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _scoring_threads() == []

    PLAN["hang"] = "native"
    assert not _materialize(data_root, instance).success
    assert len(_scoring_threads()) == 1
    os.write(PLAN["pipe"][1], b"x")  # the native call returns
    deadline = time.monotonic() + 30
    while _scoring_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _scoring_threads() == []


def _scoring_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nightshift-score" and t.is_alive()]


def test_a_stall_is_time_the_capacity_policy_counts_as_work_left(
    data_root, store, instance, stuck_pipe
) -> None:
    PLAN["hang"] = "python"
    assert not _materialize(data_root, instance).success
    target = store.partition_target("doubled", DAY)
    ledger = LedgerBook(target, "doubled", DAY).open()
    [attempt] = ledger.attempts
    assert attempt.interrupted and attempt.stalled_s >= STALL["stall_floor_seconds"]

    # A night with an hour of work left and 75 minutes to its deadline stays on spot; the
    # same night after a 20-minute stall has more work left than a reclaim could survive.
    calm = _facts(stalled_s=0.0)
    decision, why = deadline_decision(calm)
    assert decision.capacity == "spot" and "stalls" not in why
    decision, why = deadline_decision(_facts(stalled_s=1200.0))
    assert decision.capacity == "on_demand"
    assert why.endswith("; 1200 s lost to stalls counted as work left")


def _facts(stalled_s: float) -> NightFacts:
    now = 1_000_000.0
    ready = ReadyBy(dt.datetime.fromtimestamp(now + 4500, dt.UTC), "07:00")
    return NightFacts(
        rows_left=3600 * 1000,
        rows_total=4 * 3600 * 1000,
        rows_per_second=1000.0,
        restart_overhead_s=120.0,
        first_started=now + 4500 - 6 * 3600,
        now=now,
        ready=ready,
        interruptions=1,
        on_demand_after=3,
        stalled_s=stalled_s,
    )


@pytest.mark.parametrize(
    ("limit", "median", "expected"),
    [
        (StallLimit(), None, 900.0),  # no batch yet: the ceiling
        (StallLimit(), 0.5, 60.0),  # 20 x 0.5 s is below the floor
        (StallLimit(), 10.0, 200.0),  # 20 x the median
        (StallLimit(), 120.0, 900.0),  # capped at the ceiling
        (StallLimit(seconds=42.0), 10.0, 42.0),  # the override
        (StallLimit(floor=5, ceiling=50, batch_multiple=3), 4.0, 12.0),
    ],
)
def test_the_limit_is_a_multiple_of_the_median_batch_between_floor_and_ceiling(
    limit, median, expected
) -> None:
    assert limit.after(median) == expected


def test_the_watchdog_names_the_shard_its_last_batch_and_the_wait() -> None:
    now = [100.0]
    heartbeat = Heartbeat(clock=lambda: now[0])
    watchdog = Watchdog(heartbeat, StallLimit(floor=2, ceiling=10, batch_multiple=4))
    now[0] += 9.0
    assert watchdog.stalled() is None  # before a batch: the ceiling
    now[0] += 5.0  # a long first read of the input; the first shard is then handed out
    heartbeat.handed_out()
    assert watchdog.stalled() is None
    heartbeat.shard_started(3)
    for batch in range(1, 6):
        heartbeat.beat(3, batch, 1.0)
    now[0] += 3.9
    assert watchdog.stalled() is None  # 4 x the median of 1 s
    now[0] += 0.2
    stall = watchdog.stalled()
    assert (stall.shard, stall.batches, stall.limit) == (3, 5, 4.0)
    assert stall.describe() == (
        "no model call finished for 4.1 s in shard 3 after its batch 5 "
        "(limit 4.0 s: 4x the day's median batch of 1 s)"
    )
    off = Watchdog(Heartbeat(clock=lambda: now[0]), StallLimit(seconds=0))
    now[0] += 10_000
    assert off.stalled() is None


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"floor": 0}, "stall floor (0 s) must be > 0"),
        ({"floor": 10, "ceiling": 5}, "at most the ceiling (5 s)"),
        ({"batch_multiple": 0}, "stall batch multiple must be > 0"),
        ({"seconds": -1}, "stall seconds must be >= 0"),
    ],
)
def test_bad_stall_settings_are_a_clear_error(settings, says) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        StallLimit(**settings)


def test_the_settings_come_from_the_environment(monkeypatch) -> None:
    from orchestration.resources import engine_overrides

    monkeypatch.setenv("NIGHTSHIFT_STALL_SECONDS", "120")
    monkeypatch.setenv("NIGHTSHIFT_STALL_FLOOR_SECONDS", "30")
    monkeypatch.setenv("NIGHTSHIFT_STALL_CEILING_SECONDS", "600")
    monkeypatch.setenv("NIGHTSHIFT_STALL_BATCH_MULTIPLE", "10")
    limit = InferenceResource(**engine_overrides()).stall_limit()
    assert limit == StallLimit(seconds=120.0, floor=30.0, ceiling=600.0, batch_multiple=10.0)


# -- on Ray: the stuck call is in a worker process, which is killed ---------------------------


@pytest.fixture(scope="module")
def ray():
    yield from local_ray(sys.modules[__name__])


@dataclass(frozen=True)
class SleepsAt:
    """Doubles ids, 50 rows a call of ``seconds``; the call that starts at id ``at`` sleeps for
    ever."""

    at: int | None
    seconds: float = 0.0

    def __call__(self, rows: pa.Table) -> ModelStep:
        def transform(batch: pa.RecordBatch, prepared) -> pa.Table:
            if batch["id"][0].as_py() == self.at:
                while True:
                    time.sleep(1)
            time.sleep(self.seconds)
            ids = batch["id"].to_numpy()
            return pa.table({"id": ids, "y": ids * 2.0})

        return ModelStep(transform)


def _ray_day(store: DataStore, pool, at: int | None, lineage: str, seconds: float = 0.0):
    writer = ShardedWriter(
        ShardFileTargets(store.partition_target("out", DAY), SCHEMA), "fp", SHARD_ROWS, lineage
    )
    # The ceiling covers the actors' start (a torch import each) on a busy machine; the stalls
    # come after calls have finished, so the floor is their limit.
    limit = StallLimit(floor=3.0, ceiling=120.0, batch_multiple=20.0)
    return run_partition(
        writer,
        lambda: row_range_shards([pa.record_batch({"id": np.arange(ROWS)})], SHARD_ROWS),
        ShardJob(writer.files(), SleepsAt(at, seconds), batch_size=50),
        pool,
        Watch(watchdog=pool.watchdog(limit)),
    )


def test_a_ray_worker_stuck_in_a_model_call_is_killed_and_the_retry_resumes(ray, store) -> None:
    from inference.engine.ray_pool import RayPool

    pool = RayPool(ray, workers=2, cpus_per_worker=1, gpus_per_worker=0)
    pids = pool.pids()
    try:
        with pytest.raises(Stalled) as err:
            _ray_day(store, pool, at=STUCK_AT, lineage="run-a")
    finally:
        pool.close()
    stall = err.value.stall
    assert (stall.shard, stall.batches) == (2, 2)  # 50-row calls: 400 and 450 finished
    assert 3.0 <= stall.waited <= 3.0 + 2 * BEAT_SECONDS + 4 * WAIT_SECONDS + 1.0
    assert "in shard 2 after its batch 2 (limit 3.0 s: the floor;" in str(err.value)
    # Shards 0, 1 and 3 finish on either worker; shard 4 too, unless it was queued behind the
    # stuck one.
    assert err.value.shards_done >= 3
    # The stuck worker's process is gone: the call that never returns ended with it.
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)
    assert not store.output_exists("out", DAY)

    retry_pool = RayPool(ray, workers=2, cpus_per_worker=1, gpus_per_worker=0)
    try:
        report = _ray_day(store, retry_pool, at=None, lineage="run-b")
    finally:
        retry_pool.close()
    assert report.shards_resumed == err.value.shards_done
    assert report.stalls == 1 and report.rows_out == ROWS
    out = store.read_output("out", DAY).sort_by("id")
    assert out["id"].to_pylist() == list(range(ROWS))
    assert out["y"].to_pylist() == [2.0 * i for i in range(ROWS)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_sigstopped_ray_worker_is_a_stall_and_its_process_is_killed(ray, store) -> None:
    from inference.engine.ray_pool import RayPool

    pool = RayPool(ray, workers=2, cpus_per_worker=1, gpus_per_worker=0)
    stopped: list[int] = []

    def stop_the_worker_of_shard_2() -> None:
        """SIGSTOPs the worker that starts shard 2 (a node frozen, not gone)."""
        deadline = time.monotonic() + 60
        while not stopped and time.monotonic() < deadline:
            for marker in started_shards(store, "out", DAY):
                if marker.get("shard") == 2 and "worker" in marker:
                    pid = int(marker["worker"].rsplit(":", 1)[1])
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
                    return
            time.sleep(0.01)

    freezer = threading.Thread(target=stop_the_worker_of_shard_2)
    freezer.start()
    try:
        with pytest.raises(Stalled) as err:
            # 0.1 s a call, 4 calls a shard: the stop lands inside shard 2
            _ray_day(store, pool, at=None, lineage="run-a", seconds=0.1)
    finally:
        freezer.join()
        pool.close()
    assert stopped, "no worker was seen starting shard 2"
    assert err.value.stall.shard == 2
    deadline = time.monotonic() + 30
    while _alive(stopped[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(stopped[0])  # killed, stopped as it was

    retry_pool = RayPool(ray, workers=2, cpus_per_worker=1, gpus_per_worker=0)
    try:
        report = _ray_day(store, retry_pool, at=None, lineage="run-b")
    finally:
        retry_pool.close()
    assert report.shards_resumed == err.value.shards_done and report.stalls == 1
    out = store.read_output("out", DAY).sort_by("id")
    assert out["y"].to_pylist() == [2.0 * i for i in range(ROWS)]


def test_a_batch_twenty_times_slower_than_the_others_is_not_a_stall(store) -> None:
    """The limit is a multiple of the day's median call with a floor: one slow call within it
    is waited for, and the day is published with no stall."""
    from inference.engine.local_pool import LocalPool

    def transform(batch: pa.RecordBatch, prepared) -> pa.Table:
        time.sleep(0.4 if batch["id"][0].as_py() == STUCK_AT else 0.02)
        ids = batch["id"].to_numpy()
        return pa.table({"id": ids, "y": ids * 2.0})

    writer = ShardedWriter(
        ShardFileTargets(store.partition_target("out", DAY), SCHEMA), "fp", SHARD_ROWS, "run-a"
    )
    pool = LocalPool(lambda: None)
    watchdog = pool.watchdog(StallLimit(floor=2.0, ceiling=10.0, batch_multiple=20.0))
    try:
        report = run_partition(
            writer,
            lambda: row_range_shards([pa.record_batch({"id": np.arange(ROWS)})], SHARD_ROWS),
            ShardJob(writer.files(), lambda rows: ModelStep(transform), batch_size=BATCH),
            pool,
            Watch(watchdog=watchdog),
        )
    finally:
        pool.close()
    assert report.stalls == 0 and report.interruptions == 0 and report.rows_out == ROWS
    out = store.read_output("out", DAY).sort_by("id")
    assert out["y"].to_pylist() == [2.0 * i for i in range(ROWS)]
