"""Device faults (out of memory at the batch floor, CUDA errors, OOM-killed workers) fail once, named."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from dagster import AssetKey, DagsterEventType, DagsterInstance
from fraud_world import trained_fraud_world
from helpers import asset_metadata
from ray_world import local_ray, started_shards

import assets.fraud.scoring as fraud_scoring
from assets.fraud.demo_data import generate_day
from inference.engine.adaptive import AdaptiveBatchSize, BatchTooLargeError
from inference.engine.faults import (
    DEVICE_ERROR,
    OOM_AT_FLOOR,
    OOM_KILLED,
    OUT_OF_MEMORY,
    DeviceFault,
    OomKillCounter,
    WorkerDeaths,
    device_faults,
    fault_kind,
    ray_fault,
)
from inference.engine.ray_pool import RayPool
from inference.engine.shard_worker import RUNNING_DIR, ModelStep, ShardJob
from inference.engine.shard_writer import ShardedWriter, ShardFileTargets
from inference.engine.shards import row_range_shards, run_partition
from orchestration.definitions import build_definitions
from policy.retries import ERROR_RETRY_POLICY
from policy.tags import INTERRUPTED_TAG, RETRY_ON_STEP_FAILURE_TAG
from resources.storage import DataStore

DAY = "2026-04-02"
JOB = "fraud_scoring_job"
STEP = "fraud_scores"
ILLEGAL_ACCESS = "CUDA error: an illegal memory access was encountered"


# --- the classifier ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (BatchTooLargeError("out of memory at the minimum batch size 1", 1, 1), OOM_AT_FLOOR),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), OUT_OF_MEMORY),
        (RuntimeError("MPS backend out of memory"), OUT_OF_MEMORY),
        (RuntimeError(ILLEGAL_ACCESS), DEVICE_ERROR),
        (RuntimeError("CUDA error: device-side assert triggered"), DEVICE_ERROR),
        (RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasSgemm"), DEVICE_ERROR),
        (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"), DEVICE_ERROR),
        (RuntimeError("CUDA error: uncorrectable ECC error encountered"), DEVICE_ERROR),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x1)"), None),
        (ValueError("CUDA error in a value error is user code, not the device"), None),
        (KeyError("amount"), None),
    ],
)
def test_device_faults_are_told_from_other_errors(exc: BaseException, kind: str | None) -> None:
    assert fault_kind(exc) == kind


def test_torch_accelerator_errors_are_device_errors() -> None:
    accelerator = getattr(torch, "AcceleratorError", None)
    if accelerator is None:
        pytest.skip(f"torch {torch.__version__} has no AcceleratorError")
    assert fault_kind(accelerator("unspecified launch failure")) == DEVICE_ERROR


def test_an_oom_at_the_floor_becomes_one_line_with_shard_batch_and_memory() -> None:
    sizer = AdaptiveBatchSize(64)

    def always_out_of_memory(start: int, stop: int) -> None:
        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried {stop - start} rows")

    with pytest.raises(DeviceFault) as raised, device_faults(shard=3, rows=64):
        list(sizer.run(64, always_out_of_memory))
    fault = raised.value
    assert fault.kind == OOM_AT_FLOOR and isinstance(fault.__cause__, BatchTooLargeError)
    assert "\n" not in fault.line and str(fault) == fault.line
    assert fault.line.startswith("device fault: out of memory at the floor batch size 1 ")
    assert "on shard 3, a call of 64 rows" in fault.line
    # No CUDA here: the process's memory and what its cgroup or machine has left.
    assert "process RSS" in fault.line and "GiB" in fault.line
    # It crosses from a Ray worker to the driver unchanged.
    again = pickle.loads(pickle.dumps(fault))
    assert (again.kind, again.line) == (fault.kind, fault.line)


def test_a_single_item_too_large_names_the_item_not_a_floor_of_its_size() -> None:
    sizer = AdaptiveBatchSize(512)

    def out_of_memory(start: int, stop: int) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(DeviceFault, match="single item of size 300") as raised:
        with device_faults(shard=0, rows=1):
            list(sizer.run(1, out_of_memory, unit=300))
    assert raised.value.kind == OOM_AT_FLOOR


def test_other_errors_pass_unchanged() -> None:
    with pytest.raises(KeyError, match="amount"), device_faults(shard=0, rows=8):
        raise KeyError("amount")


def test_the_oom_kill_counter_reads_v2_and_v1_files(tmp_path: Path) -> None:
    v2 = tmp_path / "memory.events"
    v2.write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 1\noom_group_kill 0\n")
    counter = OomKillCounter(str(v2))
    assert counter.baseline == 1 and not counter.rose()
    v2.write_text("low 0\nhigh 0\nmax 5\noom 3\noom_kill 2\noom_group_kill 0\n")
    assert counter.rose()
    v1 = tmp_path / "memory.oom_control"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    assert OomKillCounter(str(v1)).count() == 7
    assert OomKillCounter(str(tmp_path / "absent")).count() == 0


def _actor_died(detail: str) -> BaseException:
    """Ray's error for an actor task whose worker died, as Ray words it."""
    errors = pytest.importorskip("ray.exceptions")
    from ray.core.generated.common_pb2 import ActorDiedErrorContext

    message = f"The actor is dead because its worker process has died. {detail}"
    return errors.ActorDiedError(ActorDiedErrorContext(actor_id=b"a" * 16, error_message=message))


def test_ray_names_its_memory_kills_and_other_deaths_stay_errors() -> None:
    ray_module = pytest.importorskip("ray")
    errors = ray_module.exceptions
    low = "Task was killed due to the node running low on memory."
    fault = ray_fault(ray_module, errors.OutOfMemoryError(f"{low}\nMemory on the node..."), 4, 64)
    assert fault.kind == OOM_KILLED
    assert fault.line == (
        f"device fault: a Ray worker was killed for memory on shard 4, batch size 64 ({low})"
    )
    died = _actor_died(f"Worker exit type: NODE_OUT_OF_MEMORY Worker exit detail: {low}")
    fault = ray_fault(ray_module, died, 2, 32)
    assert fault.kind == OOM_KILLED and "NODE_OUT_OF_MEMORY" in fault.line
    crashed = _actor_died("Worker exit type: SYSTEM_ERROR Worker exit detail: connection error")
    assert ray_fault(ray_module, crashed, 2, 32) is None
    assert ray_fault(ray_module, errors.WorkerCrashedError(), 2, 32) is None


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


@pytest.mark.parametrize("oom_kill", [True, False])
def test_a_killed_worker_process_is_oom_killed_only_when_the_counter_rose(
    tmp_path: Path, oom_kill: bool
) -> None:
    events = tmp_path / "memory.events"
    _write_events(events, 3)
    deaths = WorkerDeaths(OomKillCounter(str(events)))
    worker, other = _sleeper(), _sleeper()
    try:
        host = socket.gethostname()
        deaths.watch(0, f"{host}:{worker.pid}")
        deaths.watch(1, f"{host}:{other.pid}")
        deaths.submitted("first", 0, 7, 64)
        deaths.submitted("second", 1, 8, 64)
        deaths.check()  # both alive: nothing to say
        if oom_kill:
            _write_events(events, 4)  # the kernel counts the kill, then sends SIGKILL
        worker.send_signal(signal.SIGKILL)  # not reaped yet: a zombie is dead too
        worker_name = f"{host}:{worker.pid}"
        for _ in range(500):
            if _state_of(worker.pid) in ("Z", ""):
                break
            time.sleep(0.01)
        if oom_kill:
            with pytest.raises(DeviceFault) as raised:
                deaths.check()
            assert raised.value.kind == OOM_KILLED
            assert raised.value.line.startswith(
                f"device fault: worker {worker_name} killed by the kernel's OOM killer on "
                f"shard 7, batch size 64 (the oom_kill counter of {events} rose; "
            )
        else:
            deaths.check()  # a plain kill: its shard is redone
            _write_events(events, 4)  # a later kill of something else is not this one's
            deaths.check()
    finally:
        for process in (worker, other):
            process.kill()
            process.wait()


def _state_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return ""


# --- a real scoring day ----------------------------------------------------------------------


class Injection:
    """A fault every fraud model loaded while it is ``active`` raises from its second call on
    (every call after its first, at every batch size); ``sizes``: the rows of each call that
    raised it."""

    def __init__(self, fault: type[BaseException], message: str):
        self.fault, self.message = fault, message
        self.active, self.loads = True, 0
        self.sizes: list[int] = []


class FaultyModel(torch.nn.Module):
    """The fraud model, with an :class:`Injection`."""

    def __init__(self, model: torch.nn.Module, injection: Injection):
        super().__init__()
        self.model, self.injection, self.calls = model, injection, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        injection = self.injection
        if injection.active and self.calls > 1:
            injection.sizes.append(len(x))
            raise injection.fault(injection.message)
        return self.model(x)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A data root with a trained fraud model and one landed day, copied by each test."""
    root = tmp_path_factory.mktemp("device_faults") / "data"
    world = trained_fraud_world(root, "2026-04-01", 0.02)
    generate_day(world["store"], DAY, scale=0.02)
    return root


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # Several shards, each one model call: the first shard finishes before the fault.
    monkeypatch.setenv("NIGHTSHIFT_SHARD_ROWS", "500")
    monkeypatch.setenv("NIGHTSHIFT_MAX_BATCH_SIZE", "2048")


@pytest.fixture(scope="module")
def clean_scores(pristine: Path, tmp_path_factory) -> pa.Table:
    """The day scored without a fault, on a copy of its own."""
    root = tmp_path_factory.mktemp("clean") / "data"
    shutil.copytree(pristine, root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NIGHTSHIFT_DATA_ROOT", str(root))
        patch.setenv("NIGHTSHIFT_SHARD_ROWS", "500")
        patch.setenv("NIGHTSHIFT_MAX_BATCH_SIZE", "2048")
        result, _, _ = _run_job()
    assert result.success
    return _scores(root)


@pytest.fixture
def root(pristine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings) -> Path:
    root = tmp_path / "data"
    shutil.copytree(pristine, root)
    monkeypatch.setenv("NIGHTSHIFT_DATA_ROOT", str(root))
    return root


def _inject(monkeypatch: pytest.MonkeyPatch, fault: type[BaseException], message: str) -> Injection:
    """Every fraud scorer loaded from now on gets a faulty model."""
    injection = Injection(fault, message)
    load = fraud_scoring.load_scorer

    def faulty_scorer(*args, **kwargs):
        scorer = load(*args, **kwargs)
        scorer.model = FaultyModel(scorer.model, injection)
        injection.loads += 1
        return scorer

    monkeypatch.setattr(fraud_scoring, "load_scorer", faulty_scorer)
    return injection


def _run_job():
    """The scoring step of the real job, with the project's retry policy."""
    job = build_definitions("local").resolve_job_def(JOB)
    with DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(
            partition_key=DAY,
            instance=instance,
            raise_on_error=False,
            asset_selection=[AssetKey(STEP)],
        )
        run = instance.get_run_by_id(result.run_id)
        return result, instance.all_logs(result.run_id), run.tags


def _failed_once(result, logs, tags) -> tuple[str, dict]:
    """Asserts the step failed on its first attempt, without a retry and without asking the
    daemon for a relaunch; returns its message and metadata."""
    assert not result.success
    assert ERROR_RETRY_POLICY.max_retries > 0  # the policy would have retried an error
    kinds = [
        e.dagster_event.event_type
        for e in logs
        if e.dagster_event and e.dagster_event.step_key == STEP
    ]
    assert kinds.count(DagsterEventType.STEP_START) == 1
    assert DagsterEventType.STEP_UP_FOR_RETRY not in kinds
    assert INTERRUPTED_TAG not in tags and tags.get(RETRY_ON_STEP_FAILURE_TAG) != "true"
    [failure] = [e for e in result.get_step_failure_events() if e.step_key == STEP]
    data = failure.step_failure_data
    assert data.error.cls_name == "Failure"
    metadata = {k: v.value for k, v in (data.user_failure_data.metadata or {}).items()}
    return data.error.message, metadata


def _scores(root: Path) -> pa.Table:
    return DataStore(str(root)).read_output(STEP, DAY).sort_by("transaction_id").combine_chunks()


def _fault_logged(logs, line: str) -> bool:
    return any(e.user_message == line for e in logs if e.level >= 40)


def test_oom_at_every_batch_size_fails_once_naming_the_floor_and_the_rerun_resumes(
    root, monkeypatch, clean_scores
) -> None:
    model = _inject(monkeypatch, torch.OutOfMemoryError, "CUDA out of memory. Tried 1 GiB")
    message, metadata = _failed_once(*_run_job())
    assert model.loads == 1
    # The back-off halved down to its floor before giving up, on one call of the shard.
    assert model.sizes[-1] == 1 and model.sizes == sorted(model.sizes, reverse=True)
    assert metadata["device_fault"] == OOM_AT_FLOOR
    line = metadata["fault"]
    assert line.startswith("device fault: out of memory at the floor batch size 1 on shard ")
    call_rows = int(re.search(r"a call of (\d+) rows", line).group(1))
    assert 1 < call_rows <= model.sizes[0] and "GiB" in line
    assert f"fraud_scores {DAY}: {line}. Not retried: a retry meets the same rows" in message
    kept = metadata["shards_kept"]
    assert kept >= 1 and f"{kept} finished shard" in message

    # The operator fixes the cause; the rerun resumes from the kept shards.
    model.active = False
    result, _, _ = _run_job()
    assert result.success
    assert asset_metadata(result, STEP)["shards_resumed"] == kept
    assert _scores(root).equals(clean_scores)


def test_a_cuda_device_error_fails_once_named_in_one_line(root, monkeypatch) -> None:
    model = _inject(monkeypatch, RuntimeError, f"{ILLEGAL_ACCESS}\nCUDA kernel errors might be")
    result, logs, tags = _run_job()
    message, metadata = _failed_once(result, logs, tags)
    assert len(model.sizes) == 1  # not backed off: a smaller batch meets the same device
    assert metadata["device_fault"] == DEVICE_ERROR
    line = metadata["fault"]
    assert line.startswith(f"device fault: {ILLEGAL_ACCESS} on shard ")
    assert re.search(r"on shard \d+, a call of \d+ rows \(process RSS ", line)
    assert "\n" not in line
    assert "Xid" in message and metadata["shards_kept"] >= 1
    assert _fault_logged(logs, line)


# --- a worker the kernel's OOM killer took (local Ray) ---------------------------------------

SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64())])
ROWS, SHARD_ROWS, BATCH = 1_200, 200, 50


@dataclass(frozen=True)
class SlowDouble:
    """Doubles ids, ``seconds`` per model call of :data:`BATCH` rows: a shard takes 4 calls."""

    seconds: float

    def __call__(self, rows: pa.Table) -> ModelStep:
        def transform(batch: pa.RecordBatch, prepared) -> pa.Table:
            time.sleep(self.seconds)
            ids = batch["id"].to_numpy()
            return pa.table({"id": ids, "y": ids * 2.0})

        return ModelStep(transform)


@pytest.fixture(scope="module")
def ray():
    yield from local_ray(sys.modules[__name__])


@pytest.fixture
def memory_events(tmp_path: Path) -> Path:
    """A cgroup v2 ``memory.events`` the test plays the kernel on."""
    events = tmp_path / "cgroup" / "memory.events"
    events.parent.mkdir()
    _write_events(events, 0)
    return events


def _write_events(events: Path, kills: int) -> None:
    events.write_text(f"low 0\nhigh 0\nmax {kills}\noom {kills}\noom_kill {kills}\n")


def _writer(store: DataStore) -> ShardedWriter:
    target = store.partition_target("out", "2026-03-01")
    return ShardedWriter(ShardFileTargets(target, SCHEMA), "fp", SHARD_ROWS, "run-a")


def _input() -> list[pa.RecordBatch]:
    ids = np.arange(ROWS)
    return [pa.record_batch({"id": ids[i : i + 130]}) for i in range(0, ROWS, 130)]


def _score_killing_a_worker(
    ray, store, events: Path, oom_kill: bool
) -> tuple[dict, Any, ShardedWriter]:
    """Scores the day on two local Ray workers, SIGKILLing the worker of the first shard seen
    started once another shard is recorded; with ``oom_kill``, the cgroup's OOM kill count
    rises first (as the kernel counts before it kills). Returns the kill and what the day did
    (its report, or the error it raised) and its writer."""
    pool = RayPool(ray, 2, 1, 0, oom_kills=OomKillCounter(str(events)))
    writer = _writer(store)
    killed: dict = {}

    def kill_a_worker_mid_shard() -> None:
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            recorded = writer.progress.shards
            for marker in started_shards(store, "out", "2026-03-01") if recorded else []:
                if str(marker["shard"]) in recorded or "worker" not in marker:
                    continue
                if oom_kill:
                    _write_events(events, 1)
                os.kill(int(marker["worker"].rsplit(":", 1)[1]), signal.SIGKILL)
                killed.update(marker)
                break
            time.sleep(0.01)

    killer = threading.Thread(target=kill_a_worker_mid_shard)
    killer.start()
    try:
        job = ShardJob(writer.files(), SlowDouble(0.2), batch_size=BATCH)
        shards = lambda: row_range_shards(_input(), SHARD_ROWS)  # noqa: E731
        outcome: Any = run_partition(writer, shards, job, pool)
    except DeviceFault as fault:
        outcome = fault
    finally:
        killer.join()
        pool.close()
    assert killed, "no worker was seen computing a shard"
    return killed, outcome, writer


def _day_is_whole(store: DataStore) -> None:
    out = store.read_output("out", "2026-03-01").sort_by("id")
    assert out["id"].to_pylist() == list(range(ROWS))
    assert out["y"].to_pylist() == [2.0 * i for i in range(ROWS)]


def test_a_worker_the_oom_killer_took_is_named_and_not_redone(ray, store, memory_events) -> None:
    killed, fault, writer = _score_killing_a_worker(ray, store, memory_events, oom_kill=True)
    assert isinstance(fault, DeviceFault) and fault.kind == OOM_KILLED
    assert fault.line.startswith(
        f"device fault: worker {killed['worker']} killed by the kernel's OOM killer "
        f"on shard {killed['shard']}, batch size {BATCH} "
        f"(the oom_kill counter of {memory_events} rose; "
    )
    assert "GiB" in fault.line and "\n" not in fault.line
    # Not committed, and the killed shard not redone: the finished shards wait in staging.
    assert store.partition_target("out", "2026-03-01").table.current() is None
    kept = len(writer.progress.shards)
    assert kept >= 1 and str(killed["shard"]) not in writer.progress.shards
    # After the fix (a bigger node), the rerun resumes from them.
    report = _score_again(ray, store, memory_events)
    assert report.shards_resumed == kept and report.rows_out == ROWS
    _day_is_whole(store)


def _score_again(ray, store, events: Path):
    pool = RayPool(ray, 2, 1, 0, oom_kills=OomKillCounter(str(events)))
    writer = _writer(store)
    try:
        job = ShardJob(writer.files(), SlowDouble(0.0), batch_size=BATCH)
        return run_partition(writer, lambda: row_range_shards(_input(), SHARD_ROWS), job, pool)
    finally:
        pool.close()


def test_a_plain_sigkill_of_a_worker_is_still_redone(ray, store, memory_events) -> None:
    _, report, _ = _score_killing_a_worker(ray, store, memory_events, oom_kill=False)
    assert not isinstance(report, DeviceFault), report
    # The killed worker's shard was redone (a reclaimed node, as before), and nothing else.
    assert report.rows_redone == SHARD_ROWS and report.rows_out == ROWS
    _day_is_whole(store)


def test_a_scoring_step_whose_ray_worker_the_oom_killer_took_fails_once(
    ray, root, memory_events, monkeypatch
) -> None:
    """The fraud day on the step's Ray workers: the worker of the first shard seen started is
    SIGKILLed after the cgroup's OOM kill count rose."""
    monkeypatch.setenv("NIGHTSHIFT_EXECUTOR", "ray")
    monkeypatch.setenv("NIGHTSHIFT_RAY_WORKERS", "2")
    monkeypatch.setenv("NIGHTSHIFT_CGROUP_MEMORY_EVENTS", str(memory_events))
    running = f"{DataStore(str(root)).partition_target(STEP, DAY).staging_dir}/{RUNNING_DIR}"
    killed: list[str] = []
    finished = threading.Event()

    def oom_kill_the_first_worker_seen() -> None:
        while not killed and not finished.wait(0.01):
            for marker in Path(running).glob("*.json") if os.path.isdir(running) else []:
                try:
                    worker = json.loads(marker.read_text())["worker"]
                except (OSError, ValueError, KeyError):  # being written
                    continue
                _write_events(memory_events, 1)
                os.kill(int(worker.rsplit(":", 1)[1]), signal.SIGKILL)
                killed.append(worker)
                break

    killer = threading.Thread(target=oom_kill_the_first_worker_seen)
    killer.start()
    try:
        result, logs, tags = _run_job()
    finally:
        finished.set()
        killer.join()
    assert killed, "no worker was seen computing a shard"
    message, metadata = _failed_once(result, logs, tags)
    assert metadata["device_fault"] == OOM_KILLED
    line = metadata["fault"]
    assert line.startswith(f"device fault: worker {killed[0]} killed by the kernel's OOM killer ")
    assert f"the oom_kill counter of {memory_events} rose" in line
    assert f"fraud_scores {DAY}: {line}. Not retried: the workers need more memory" in message
    assert _fault_logged(logs, line)
