"""Stragglers on Ray: the last shard in flight, far slower than the day's median, gets a second
copy on an idle worker and the first to finish is recorded, once; a SIGSTOPped worker is
replaced and its shard handed to another, and the day completes without failing. Each day
publishes the output of a clean run, each row once, and its metadata counts what happened."""

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest
from ray_world import local_ray, started_shards

from inference.engine.ray_pool import BEAT_SECONDS
from inference.engine.shard_worker import ModelStep, ShardJob
from inference.engine.shard_writer import ShardedWriter, ShardFileTargets
from inference.engine.shards import WAIT_SECONDS, Watch, row_range_shards, run_partition
from inference.engine.watchdog import StallLimit
from resources.inference import InferenceResource
from resources.storage import DataStore

SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64())])
DAY = "2026-03-02"
ROWS, SHARD_ROWS, BATCH = 1000, 200, 50
CALL_SECONDS = 0.05
# The straggler: the last shard, whose first call (id 800) sleeps twenty times its shard's
# four calls, the first time it runs only.
SLOW_AT, SLOWER = 800, 20
SLOW_SECONDS = SLOWER * CALL_SECONDS * SHARD_ROWS / BATCH
# The ceiling covers the actors' start (a torch import each) on a busy machine; a stall comes
# after calls have finished, so the floor is its limit: above the straggler's slow call where
# the straggler is waited for, a few seconds where a worker is frozen.
LIMIT = StallLimit(floor=2 * SLOW_SECONDS, ceiling=120.0, batch_multiple=20.0)
FROZEN_LIMIT = StallLimit(floor=3.0, ceiling=120.0, batch_multiple=20.0)
# A frozen worker's calls: long enough that the freeze lands inside shard 2.
FROZEN_CALL_SECONDS = 0.1


@pytest.fixture(scope="module")
def ray():
    yield from local_ray(sys.modules[__name__])


@pytest.fixture
def pool(ray):
    from inference.engine.ray_pool import RayPool

    pool = RayPool(ray, workers=2, cpus_per_worker=1, gpus_per_worker=0)
    yield pool
    pool.close()


@dataclass(frozen=True)
class SlowOnce:
    """Doubles ids, ``CALL_SECONDS`` a call; the run of the shard starting at ``SLOW_AT`` that
    first creates ``marker`` sleeps ``SLOWER`` times its shard's calls in its first call."""

    marker: str | None
    seconds: float = CALL_SECONDS

    def __call__(self, rows: pa.Table) -> ModelStep:
        def transform(batch: pa.RecordBatch, prepared) -> pa.Table:
            if self.marker and batch["id"][0].as_py() == SLOW_AT and _first(self.marker):
                time.sleep(SLOW_SECONDS)
            time.sleep(self.seconds)
            ids = batch["id"].to_numpy()
            return pa.table({"id": ids, "y": ids * 2.0})

        return ModelStep(transform)


def _first(marker: str) -> bool:
    """Whether this call is the first to claim ``marker`` (created once, atomically)."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _day(store: DataStore, pool, marker: str | None, multiple: float, frozen: bool = False):
    writer = ShardedWriter(
        ShardFileTargets(store.partition_target("out", DAY), SCHEMA), "fp", SHARD_ROWS, "run-a"
    )
    limit = FROZEN_LIMIT if frozen else LIMIT
    # No floor: this day's shards take well under a second, the slow one a few.
    watch = Watch(watchdog=pool.watchdog(limit), straggler_multiple=multiple, straggler_floor_s=0)
    model = SlowOnce(marker, FROZEN_CALL_SECONDS if frozen else CALL_SECONDS)
    report = run_partition(
        writer,
        lambda: row_range_shards([pa.record_batch({"id": np.arange(ROWS)})], SHARD_ROWS),
        ShardJob(writer.files(), model, batch_size=BATCH),
        pool,
        watch,
    )
    return report, watch


def _clean(tmp_path, pool) -> pa.Table:
    """The day as a clean run publishes it, in a data root of its own (it also warms the
    actors, so the day's median shard is not an actor's start)."""
    store = DataStore(str(tmp_path / "clean"))
    report, _ = _day(store, pool, None, multiple=3.0)
    assert report.stragglers_copied == 0 and report.stalls == 0
    return store.read_output("out", DAY).sort_by("id")


def _assert_clean(store: DataStore, clean: pa.Table) -> None:
    out = store.read_output("out", DAY).sort_by("id")
    assert out.num_rows == ROWS and len(set(out["id"].to_pylist())) == ROWS  # each row once
    assert out.equals(clean)
    assert out["y"].to_pylist() == [2.0 * i for i in range(ROWS)]


def test_a_straggler_gets_a_copy_that_wins_and_is_recorded_once(pool, store, tmp_path) -> None:
    clean = _clean(tmp_path, pool)
    marker = tmp_path / "slow-once"
    report, _ = _day(store, pool, str(marker), multiple=3.0)
    assert marker.exists()  # the straggler ran
    assert report.stragglers_copied == 1 and report.straggler_copy_won == 1
    assert report.as_dict()["stragglers_copied"] == 1
    assert report.as_dict()["straggler_copy_won"] == 1
    assert report.stalls == 0 and report.interruptions == 0 and report.rows_out == ROWS
    _assert_clean(store, clean)
    # The loser was still sleeping: its actor was replaced, and the pool kept its size.
    assert pool.replaced == 1 and len(pool.actors) == 2
    assert len(set(pool.pids())) == 2


def test_with_straggler_copies_off_the_straggler_is_waited_for(pool, store, tmp_path) -> None:
    clean = _clean(tmp_path, pool)
    marker = tmp_path / "slow-once"
    report, _ = _day(store, pool, str(marker), multiple=0.0)
    assert marker.exists()
    assert report.stragglers_copied == 0 and report.straggler_copy_won == 0
    assert report.stalls == 0 and pool.replaced == 0
    _assert_clean(store, clean)


def test_a_sigstopped_worker_is_replaced_and_the_day_completes(pool, store, tmp_path) -> None:
    """Copies far off (a multiple no shard reaches), replacement on: the stall is got past by
    a fresh worker, within the stall limit the settings give."""
    clean = _clean(tmp_path, pool)
    stopped = _freeze_the_worker_of_shard_2(store)
    try:
        report, watch = _day(store, pool, None, multiple=1000.0, frozen=True)
    finally:
        stopped.join()
    [pid] = stopped.pids
    assert report.stalls == 1 and report.interruptions == 0 and report.rows_out == ROWS
    assert report.stragglers_copied == 0
    # One stall, waited for its limit: the floor (the batches take a fraction of a second),
    # read within a beat and a few of the driver's waits.
    bound = FROZEN_LIMIT.floor + 2 * BEAT_SECONDS + 4 * WAIT_SECONDS + 1
    assert FROZEN_LIMIT.floor <= watch.stalled_s <= bound
    _assert_clean(store, clean)
    assert pool.replaced == 1 and len(pool.actors) == 2
    assert pid not in pool.pids()
    _wait_gone(pid)


def test_a_sigstopped_worker_with_copies_on_completes_the_day(pool, store, tmp_path) -> None:
    """The default multiple: the frozen worker's shard is copied (it is the last in flight) or
    its worker replaced (another shard waits behind it); either way, the day is clean."""
    clean = _clean(tmp_path, pool)
    stopped = _freeze_the_worker_of_shard_2(store)
    try:
        report, _ = _day(store, pool, None, multiple=3.0, frozen=True)
    finally:
        stopped.join()
    [pid] = stopped.pids
    assert report.interruptions == 0 and report.rows_out == ROWS
    assert report.stalls + report.straggler_copy_won >= 1
    _assert_clean(store, clean)
    assert pool.replaced >= 1 and len(pool.actors) == 2 and pid not in pool.pids()
    _wait_gone(pid)


def test_the_setting_comes_from_the_environment(monkeypatch) -> None:
    from orchestration.resources import engine_overrides

    assert InferenceResource().straggler_multiple == 3.0
    monkeypatch.setenv("NIGHTSHIFT_STRAGGLER_MULTIPLE", "0")
    assert InferenceResource(**engine_overrides()).straggler_multiple == 0.0
    with pytest.raises(ValueError, match="straggler_multiple"):
        InferenceResource(straggler_multiple=-1)


class _Freezer(threading.Thread):
    """SIGSTOPs the worker that starts shard 2 (a node frozen, not gone)."""

    def __init__(self, store: DataStore):
        super().__init__()
        self.store, self.pids = store, []

    def run(self) -> None:
        deadline = time.monotonic() + 60
        while not self.pids and time.monotonic() < deadline:
            for marker in started_shards(self.store, "out", DAY):
                if marker.get("shard") == 2 and "worker" in marker:
                    pid = int(marker["worker"].rsplit(":", 1)[1])
                    os.kill(pid, signal.SIGSTOP)
                    self.pids.append(pid)
                    return
            time.sleep(0.01)


def _freeze_the_worker_of_shard_2(store: DataStore) -> _Freezer:
    freezer = _Freezer(store)
    freezer.start()
    return freezer


def _wait_gone(pid: int) -> None:
    """The frozen worker's process was killed, stopped as it was."""
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
