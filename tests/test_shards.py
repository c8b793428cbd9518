"""Sharded checkpointed execution: resume after interruption or kill, invalidation, leases, commit."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from inference.engine.leases import PartitionLeasedError, acquire_lease
from inference.engine.local_pool import run_local
from inference.engine.metrics import BatchMetrics
from inference.engine.shard_worker import ModelStep
from inference.engine.shard_writer import ShardedWriter, ShardFileTargets
from inference.engine.shards import Interrupted, Watch
from resources.storage import DataStore

SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64())])


def _input(n: int = 1000, chunk: int = 130) -> list[pa.RecordBatch]:
    ids = np.arange(n)
    return [pa.record_batch({"id": ids[i : i + chunk]}) for i in range(0, n, chunk)]


class Model:
    """Doubles ids; counts the rows it computed, so redone work is visible."""

    def __init__(self, fail_after_rows: int | None = None, stop_after_rows: int | None = None):
        self.rows = 0
        self.fail_after_rows, self.stop_after_rows = fail_after_rows, stop_after_rows

    def __call__(self, batch: pa.RecordBatch, prepared) -> pa.Table:
        if self.fail_after_rows is not None and self.rows >= self.fail_after_rows:
            raise MemoryError("node vanished")  # stands in for a SIGKILL: no graceful stop
        self.rows += batch.num_rows
        ids = batch["id"].to_numpy()
        return pa.table({"id": ids, "y": ids * 2.0})

    def stop(self) -> str | None:
        if self.stop_after_rows is not None and self.rows >= self.stop_after_rows:
            return "SIGTERM received"
        return None


def _run(writer, batches, model, *, batch_size, stop=None, metrics=None, progress=None, **step):
    """The partition's row ranges scored in this process by the one engine loop."""
    watch = Watch(stop or (lambda: None), progress, metrics or BatchMetrics())
    return run_local(writer, batches, ModelStep(model, **step), batch_size, watch=watch)


def _writer(store: DataStore, fp: str = "fp1", shard_rows: int = 200, lineage: str = "run-a"):
    where = ShardFileTargets(store.partition_target("out", "2026-03-01"), SCHEMA)
    return ShardedWriter(where, fp, shard_rows, lineage)


def _expected(n: int = 1000) -> list[float]:
    return [2.0 * i for i in range(n)]


@pytest.mark.parametrize("stop_after", [0, 50, 200, 390, 1000])
def test_interrupted_run_resumes_and_matches_an_uninterrupted_one(any_store, stop_after) -> None:
    store = any_store
    first = Model(stop_after_rows=stop_after)
    with pytest.raises(Interrupted) as err:
        _run(_writer(store), _input(), first, batch_size=50, stop=first.stop)
    assert not store.output_exists("out", "2026-03-01")
    finished = err.value.shards_done
    computed = min(1000, -(-stop_after // 50) * 50)  # the stop is seen at batch boundaries
    assert first.rows == computed and finished == computed // 200
    retry = Model()
    report = _run(_writer(store), _input(), retry, batch_size=64, stop=retry.stop)
    out = store.read_output("out", "2026-03-01")
    assert out["y"].to_pylist() == _expected()
    assert report.shards_resumed == finished and report.attempt == 2 and report.interruptions == 1
    assert retry.rows == 1000 - finished * 200
    assert report.rows_redone == err.value.rows_discarded <= 200


def test_killed_run_redoes_at_most_the_shard_in_flight(any_store) -> None:
    store = any_store
    with pytest.raises(MemoryError):
        _run(_writer(store), _input(), Model(fail_after_rows=450), batch_size=50)
    retry = Model()
    report = _run(_writer(store, lineage="run-a"), _input(), retry, batch_size=50)
    assert store.read_output("out", "2026-03-01")["y"].to_pylist() == _expected()
    assert report.shards_resumed == 2 and retry.rows == 600 and report.rows_redone == 200


def test_a_changed_fingerprint_discards_old_progress(store) -> None:
    first = Model(stop_after_rows=600)
    with pytest.raises(Interrupted):
        _run(_writer(store, fp="model-v1"), _input(), first, batch_size=100, stop=first.stop)
    retry = Model()
    report = _run(_writer(store, fp="model-v2"), _input(), retry, batch_size=100)
    assert report.shards_resumed == 0 and retry.rows == 1000 and report.attempt == 1


def test_rerun_replaces_a_committed_partition_and_a_retry_after_commit_is_a_no_op(
    any_store,
) -> None:
    store = any_store
    _run(_writer(store, lineage="run-a"), _input(), Model(), batch_size=100)
    again = Model()
    report = _run(_writer(store, lineage="run-a"), _input(), again, batch_size=100)
    assert report.already_committed and again.rows == 0
    fresh = Model()
    _run(_writer(store, lineage="run-b"), _input(300), fresh, batch_size=100)
    out = store.read_output("out", "2026-03-01")
    assert fresh.rows == 300 and out.num_rows == 300
    committed = store.output_figures("out", "2026-03-01")
    assert committed.text("lineage") == "run-b" and committed.value("rows") == 300
    # Three commits of the day, each one snapshot on main; the first two are history now.
    history = store.tables.history("out", "2026-03-01")
    assert [where for _, where in history if where in ("current", "published")][0] == "current"
    assert len({day.commit for day, _ in history}) == 2  # the no-op retry committed nothing


def test_empty_input_publishes_an_empty_partition(store) -> None:
    report = _run(_writer(store), [], Model(), batch_size=10)
    assert report.rows_out == 0 and store.read_output("out", "2026-03-01").num_rows == 0


def test_checkpointing_off_writes_no_progress(store) -> None:
    metrics = BatchMetrics()
    _run(_writer(store, shard_rows=0), _input(), Model(), batch_size=100, metrics=metrics)
    assert store.read_output("out", "2026-03-01").num_rows == 1000
    assert metrics.batches == 10 and metrics.phase_seconds["compute"] > 0


def test_a_live_lease_of_another_lineage_blocks_a_second_writer(any_store) -> None:
    store = any_store
    target = store.partition_target("out", "2026-03-01")
    lease = acquire_lease(target.cas, target.lease_path, "run-x", seconds=60)
    # The holder is this very process, alive: another lineage must not write beside it.
    with pytest.raises(PartitionLeasedError, match="being written by lineage run-x"):
        _run(_writer(store, lineage="run-y"), _input(), Model(), batch_size=100)
    assert not store.output_exists("out", "2026-03-01")
    lease.release()
    _run(_writer(store, lineage="run-y"), _input(), Model(), batch_size=100)
    assert store.output_exists("out", "2026-03-01")


def test_an_expired_lease_is_taken_over(any_store) -> None:
    store = any_store
    target = store.partition_target("out", "2026-03-01")
    acquire_lease(target.cas, target.lease_path, "run-x", seconds=-1)
    _run(_writer(store, lineage="run-y"), _input(), Model(), batch_size=100)
    assert store.read_output("out", "2026-03-01").num_rows == 1000


def test_shards_dictionary_encode_only_repetitive_columns():
    from inference.engine.output_partition import dictionary_columns

    n = 5000
    table = pa.table(
        {
            "transaction_id": [f"t{i}" for i in range(n)],
            "score": np.linspace(0, 1, n, dtype=np.float32),
            "flagged": [i % 7 == 0 for i in range(n)],
            "model_version": ["fraud_model-abc"] * n,
            "reason": [("null_amount", "negative_amount")[i % 2] for i in range(n)],
            "keywords": [["a", "b"]] * n,
        }
    )
    assert dictionary_columns(table) == ["model_version", "reason", "keywords"]
    assert dictionary_columns(table.slice(0, 0)) == []


def test_batches_prepared_on_several_threads_reach_the_model_in_input_order(store) -> None:
    import time as clock

    delays = np.random.default_rng(0).uniform(0, 0.01, 40)

    def prepare(batch: pa.RecordBatch) -> int:
        first = int(batch["id"][0].as_py())
        clock.sleep(delays[first // 25 % 40])  # later batches often finish first
        return first

    seen: list[tuple[int, int]] = []

    def model(batch: pa.RecordBatch, prepared: int) -> pa.Table:
        seen.append((int(batch["id"][0].as_py()), prepared))
        ids = batch["id"].to_numpy()
        return pa.table({"id": ids, "y": ids * 2.0})

    _run(_writer(store), _input(), model, batch_size=25, prepare=prepare)
    assert [first for first, _ in seen] == sorted(first for first, _ in seen)
    assert all(first == prepared for first, prepared in seen)
    assert store.read_output("out", "2026-03-01")["y"].to_pylist() == _expected()


def test_the_next_shard_is_started_on_a_thread_while_one_is_scored(store) -> None:
    """Shard 1's first call is prepared while shard 0's calls run, and every model call runs on
    the step's own thread (where a stop signal is handled)."""
    second_started = threading.Event()
    waited: list[bool] = []
    model_threads: set[str] = set()

    def prepare(batch: pa.RecordBatch) -> pa.RecordBatch:
        if batch["id"][0].as_py() == 200:  # shard 1's first call
            second_started.set()
        return batch

    def model(batch: pa.RecordBatch, prepared) -> pa.Table:
        model_threads.add(threading.current_thread().name)
        if batch["id"][0].as_py() == 150:  # shard 0's last call
            waited.append(second_started.wait(timeout=30))
        ids = batch["id"].to_numpy()
        return pa.table({"id": ids, "y": ids * 2.0})

    _run(_writer(store), _input(), model, batch_size=50, prepare=prepare)
    assert waited == [True]
    assert model_threads == {threading.current_thread().name}
    assert store.read_output("out", "2026-03-01")["y"].to_pylist() == _expected()


def test_a_shard_that_fails_to_start_fails_the_run_after_the_shard_before_is_kept(store) -> None:
    def prepare(batch: pa.RecordBatch) -> pa.RecordBatch:
        if batch["id"][0].as_py() == 400:  # shard 2 cannot be prepared
            raise ValueError("features cannot be built")
        return batch

    first = Model()
    with pytest.raises(ValueError, match="features cannot be built"):
        _run(_writer(store), _input(), first, batch_size=50, prepare=prepare)
    assert not store.output_exists("out", "2026-03-01")
    retry = Model()
    report = _run(_writer(store), _input(), retry, batch_size=50)
    # Shards 0 and 1 were recorded before shard 2's failure reached the driver.
    assert report.shards_resumed == 2 and retry.rows == 600 and report.rows_redone == 0
    assert store.read_output("out", "2026-03-01")["y"].to_pylist() == _expected()


def test_progress_is_told_after_each_shard_with_resumed_rows_apart(store) -> None:
    with pytest.raises(MemoryError):
        _run(_writer(store), _input(), Model(fail_after_rows=450), batch_size=50)
    told: list[tuple[int, int, int]] = []
    _run(_writer(store), _input(), Model(), batch_size=50, progress=lambda *a: told.append(a))
    # Shards of 200 rows: the first attempt finished two, this one writes the other three.
    assert told == [(600, 400, 3), (800, 400, 4), (1000, 400, 5)]


def test_progress_log_is_throttled_and_shows_rate_share_and_time_left() -> None:
    from inference.engine.progress import ProgressLog

    lines: list[str] = []
    now = [100.0]
    log = ProgressLog(
        lines.append, "fraud_scores 2026-03-01", 1_000, every=10, clock=lambda: now[0]
    )
    now[0] = 105.0
    log(300, 0, 1)  # too soon after the start: nothing
    now[0] = 110.0
    log(500, 100, 2)
    now[0] = 115.0
    log(700, 100, 3)  # too soon after the last line
    assert lines == [
        "fraud_scores 2026-03-01: 500 of 1,000 rows (50%) in 2 shards, 40 rows/s, about 12 s to go"
    ]
    unknown = ProgressLog(lines.append, "user_recommendations", None, clock=lambda: now[0])
    now[0] = 145.0
    unknown(90, 0, 1)
    assert lines[-1] == "user_recommendations: 90 rows in 1 shard, 3 rows/s"


def test_a_side_output_survives_a_resume_exactly_once_in_the_same_commit(any_store) -> None:
    """Rows a downstream asset needs (the even ids here) are committed beside the output, each
    once, however many attempts it took, with the output's commit id."""
    store, day = any_store, "2026-03-01"
    side_schema = pa.schema([("id", pa.int64()), ("y", pa.float64())])

    def even(batch: pa.RecordBatch, out: pa.Table) -> pa.Table:
        return out.filter(pc.equal(pc.bit_wise_and(out["id"], 1), 0))

    def writer() -> ShardedWriter:
        where = ShardFileTargets(
            store.partition_target("out", day),
            SCHEMA,
            side=store.partition_target("out_side", day),
            side_schema=side_schema,
        )
        return ShardedWriter(where, "fp", 200, "run-a")

    first = Model(stop_after_rows=500)
    with pytest.raises(Interrupted):
        _run(writer(), _input(), first, batch_size=64, stop=first.stop, side=even)
    assert not store.output_exists("out_side", day)
    report = _run(writer(), _input(), Model(), batch_size=64, side=even)

    side = store.read_output("out_side", day)
    assert sorted(side["id"].to_pylist()) == list(range(0, 1000, 2))
    assert report.rows_side == 500 and report.shards_resumed >= 2
    assert store.output_commit("out_side", day) == store.output_commit("out", day) == report.commit


def test_a_workers_peak_memory_is_its_own_not_its_parents() -> None:
    """A shard's ``peak_rss_mib`` is read in the worker that ran it; a worker started from a
    process that once held much more must report its own peak, not the parent's (a child's
    ``ru_maxrss`` starts at the parent's high-water mark)."""
    import subprocess
    import sys

    child = "from inference.engine.shard_worker import peak_rss_mb; print(round(peak_rss_mb()))"
    parent = (
        "import subprocess, sys\n"
        "held = bytearray(1024 ** 3)\n"
        "for i in range(0, len(held), 4096): held[i] = 1\n"
        f"print(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True,"
        " text=True, check=True).stdout.strip())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", parent], capture_output=True, text=True, timeout=120, check=True
    )
    assert int(done.stdout.strip()) < 512  # the parent held 1,024 MiB; the worker far less
