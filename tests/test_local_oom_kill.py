"""A step process the kernel's OOM killer took (local executor): its retry fails once, naming it."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import (
    AssetExecutionContext,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    MaterializeResult,
    asset,
    materialize,
)
from doubled_world import double_day
from helpers import asset_metadata, cpu_resources

from inference.engine.faults import MEMORY_EVENTS_SETTING, OOM_KILLED_STEP
from inference.engine.ledger import Attempt, LedgerBook, PartitionLedger
from inference.engine.oom_killed import ProcessTrace
from policy.partitions import daily_partitions
from policy.retries import ERROR_RETRY_POLICY
from policy.tags import INTERRUPTED_TAG, RETRY_NUMBER_TAG, RETRY_ON_STEP_FAILURE_TAG
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

TESTS = Path(__file__).resolve().parent
SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64())])
DAY = "2026-03-02"
ROWS, SHARD_ROWS, BATCH = 1000, 200, 100
# The killed process's model call that starts at id N tells folder F it is in flight and waits
# there: N@F. Only the shard being scored has a marker naming the process.
HOLD_SETTING = "NIGHTSHIFT_TEST_HOLD"
GIB = 1024**3


@asset(partitions_def=daily_partitions)
def doubled_ids(
    context: AssetExecutionContext, storage: StorageResource, inference: InferenceResource
) -> MaterializeResult:
    """Doubles 1,000 ids in shards of 200; in the test's killed process, one model call waits
    for a file that never comes."""
    at, _, hold = os.environ.get(HOLD_SETTING, "@").partition("@")

    def before(batch: pa.RecordBatch) -> None:
        if hold and batch["id"][0].as_py() == int(at):
            Path(hold, "in_flight").write_text(str(os.getpid()))
            while not Path(hold, "never").exists():
                time.sleep(0.01)

    return double_day(context, storage, inference, before)


def _materialize(data_root, instance, tags: dict | None = None):
    return materialize(
        [doubled_ids],
        partition_key=DAY,
        resources=cpu_resources(data_root, shard_rows=SHARD_ROWS),
        instance=instance,
        raise_on_error=False,
        tags=tags,
    )


@pytest.fixture
def memory_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cgroup v2 folder the test plays the kernel on: no kill counted yet, 0.5 GiB used of a
    2 GiB limit; the setting points this process and the killed one at it."""
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    events = cgroup / "memory.events"
    _count_kills(events, 0)
    (cgroup / "memory.current").write_text(f"{GIB // 2}\n")
    (cgroup / "memory.max").write_text(f"{2 * GIB}\n")
    monkeypatch.setenv(MEMORY_EVENTS_SETTING, str(events))
    return events


def _count_kills(events: Path, kills: int) -> None:
    events.write_text(f"low 0\nhigh 0\nmax {kills}\noom {kills}\noom_kill {kills}\n")


def _kill_mid_shard(
    data_root: Path, events: Path, tmp_path: Path, oom_kill: bool, held_at: int = 500
) -> int:
    """Scores the day in a process of its own and SIGKILLs it inside the model call that
    starts at id ``held_at`` (by default the second of shard 2, once shards 0 and 1 are
    recorded); with ``oom_kill`` the cgroup's count rises first, as the kernel counts a kill
    before it sends it. Returns the killed process's id."""
    hold = tmp_path / "hold"
    hold.mkdir()
    env = {
        **os.environ,
        HOLD_SETTING: f"{held_at}@{hold}",
        "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]),
    }
    log = tmp_path / "killed.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, __file__, str(data_root)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 180
        while not (hold / "in_flight").exists():
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the day never reached the held model call"
            time.sleep(0.02)
        if oom_kill:
            _count_kills(events, 1)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        code = process.wait(timeout=60)
    assert code == -signal.SIGKILL
    return process.pid


def _retry_tags(run: DagsterRun) -> dict[str, str]:
    """The tags the daemon's run retry launches the killed run's relaunch with."""
    tags = {k: v for k, v in run.tags.items() if k.startswith(("nightshift/", "dagster/retry"))}
    return {**tags, RETRY_NUMBER_TAG: str(int(run.tags.get(RETRY_NUMBER_TAG, 0)) + 1)}


def _killed_run(instance: DagsterInstance) -> DagsterRun:
    [run] = instance.get_runs()
    return run


def _clean_output(tmp_path: Path, instance: DagsterInstance) -> pa.Table:
    root = tmp_path / "clean"
    root.mkdir()
    assert _materialize(root, instance).success
    return DataStore(str(root)).read_output("doubled_ids", DAY).sort_by("id")


def _published_once(store: DataStore) -> pa.Table:
    out = store.read_output("doubled_ids", DAY).sort_by("id")
    ids = out.column("id").to_pylist()
    assert len(ids) == len(set(ids)) == ROWS
    return out


@pytest.mark.parametrize(
    ("held_at", "shard", "kept"),
    [
        (500, 2, 2),  # mid-day
        (100, 0, 0),  # in the first shard: nothing recorded but the attempt's start
    ],
)
def test_the_relaunch_after_an_oom_kill_fails_once_naming_it_and_a_later_launch_resumes(
    data_root, store, instance, memory_events, tmp_path, held_at, shard, kept
) -> None:
    pid = _kill_mid_shard(data_root, memory_events, tmp_path, oom_kill=True, held_at=held_at)
    killed = _killed_run(instance)
    retry = _materialize(data_root, instance, tags=_retry_tags(killed))

    assert not retry.success
    assert ERROR_RETRY_POLICY.max_retries > 0  # the policy would have retried an error
    kinds = [
        e.dagster_event.event_type
        for e in instance.all_logs(retry.run_id)
        if e.dagster_event and e.dagster_event.step_key == "doubled_ids"
    ]
    assert kinds.count(DagsterEventType.STEP_START) == 1
    assert DagsterEventType.STEP_UP_FOR_RETRY not in kinds
    tags = instance.get_run_by_id(retry.run_id).tags
    assert INTERRUPTED_TAG not in tags and tags.get(RETRY_ON_STEP_FAILURE_TAG) != "true"
    [failure] = retry.get_step_failure_events()
    data = failure.step_failure_data
    assert data.error.cls_name == "Failure"
    metadata = {k: v.value for k, v in data.user_failure_data.metadata.items()}
    assert metadata["device_fault"] == OOM_KILLED_STEP and metadata["shards_kept"] == kept
    line = metadata["fault"]
    assert line.startswith(
        f"device fault: the previous attempt (run {killed.run_id}, process "
        f"{socket.gethostname()}:{pid}) was killed by the kernel's OOM killer on shard "
        f"{shard}, batch size {BATCH} (the oom_kill counter of {memory_events} rose from 0 "
        f"to 1 since it began; its peak RSS at least "
    )
    assert line.endswith("GiB; cgroup uses 0.5 GiB of its 2.0 GiB limit)") and "\n" not in line
    message = data.error.message
    assert f"Failure: doubled_ids {DAY}: {line}. Not retried: " in message
    assert "NIGHTSHIFT_MAX_BATCH_SIZE" in message and "the next launch proceeds" in message
    assert message.endswith(
        "2 finished shards are kept: the rerun resumes from them.\n"
        if kept
        else "No shard had finished.\n"
    )
    assert not store.output_exists("doubled_ids", DAY)
    ledger = LedgerBook(store.partition_target("doubled_ids", DAY), "doubled_ids", DAY).open()
    [attempt] = ledger.attempts  # the failed relaunch scored nothing and entered nothing
    assert attempt.run_id == killed.run_id and attempt.process.reported

    # The operator's launch after the report (here without a fix: the cause is gone) resumes
    # from the kept shards and redoes only the killed one.
    again = _materialize(data_root, instance)
    assert again.success
    meta = asset_metadata(again, "doubled_ids")
    assert meta["shards_resumed"] == kept and meta["rows_redone"] == SHARD_ROWS
    assert meta["rows_out"] == ROWS
    assert _published_once(store).equals(_clean_output(tmp_path, instance))


def test_a_kill_with_the_oom_counter_unchanged_is_resumed_as_an_interruption(
    data_root, store, instance, memory_events, tmp_path
) -> None:
    _kill_mid_shard(data_root, memory_events, tmp_path, oom_kill=False)
    retry = _materialize(data_root, instance, tags=_retry_tags(_killed_run(instance)))
    assert retry.success
    meta = asset_metadata(retry, "doubled_ids")
    assert meta["shards_resumed"] == 2 and meta["rows_redone"] == SHARD_ROWS
    assert meta["rows_out"] == ROWS
    assert _published_once(store).equals(_clean_output(tmp_path, instance))


def test_the_trace_survives_the_ledger_file_and_older_entries_have_none(memory_events) -> None:
    ledger = PartitionLedger("doubled_ids", DAY)
    ledger.attempts.append(Attempt("run-a", "spot", 1.0, 2.0, 3.0))
    ledger.attempts[0].process = ProcessTrace.begin(BATCH)
    again = PartitionLedger.from_json(json.loads(json.dumps(ledger.to_json())))
    trace = again.attempts[0].process
    assert trace == ledger.attempts[0].process
    assert (trace.worker, trace.oom_kills, trace.events, trace.batch_size) == (
        f"{socket.gethostname()}:{os.getpid()}",
        0,
        str(memory_events),
        BATCH,
    )
    assert trace.peak_rss_mb > 0 and not trace.left and not trace.reported
    older = {k: v for k, v in ledger.to_json()["attempts"][0].items() if k != "process"}
    assert Attempt(**older).process is None


if __name__ == "__main__":
    # The process the tests kill: the day scored under the instance of DAGSTER_HOME.
    with DagsterInstance.get() as home:
        _materialize(sys.argv[1], home)
