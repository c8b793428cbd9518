"""Fault injection on real `dagster job execute` processes: SIGTERM, SIGKILL and spot notices."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from dagster import DagsterInstance, materialize
from helpers import reset_outputs

from assets.day_metadata import day_entries
from assets.fraud import fraud_model, fraud_scores, transactions
from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import TRANSACTIONS, TRANSACTIONS_SCHEMA
from inference.fraud.accounts import account_shards
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

BIN = Path(sys.executable).parent
TRAIN_DAY, DAY = "2026-03-01", "2026-03-02"
# Shards hold whole batches here, so every model call sees the same rows as in the baseline
# and scores match bit for bit.
SHARD_ROWS, BATCH = 960, 32
SHARDS = -(-100_000 // SHARD_ROWS)
# Small shards (each a parquet file and two progress writes) and one thread make a 100k-row
# partition take seconds to score, so there is time to interrupt it between its first and last
# shard. (Model batches no longer pace it: fraud assembles features for up to 64k rows at a
# time and scores them in max_batch_size calls.)
SLOW = {
    "NIGHTSHIFT_MAX_BATCH_SIZE": str(BATCH),
    "NIGHTSHIFT_SHARD_ROWS": str(SHARD_ROWS),
    "NIGHTSHIFT_CPU_THREADS": "1",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """A data root with a trained fraud model, a 100k-row day, and its uninterrupted scores."""
    root = tmp_path_factory.mktemp("spot")
    data, home = root / "data", root / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    store = DataStore(str(data))
    generate_day(store, TRAIN_DAY, scale=0.05)
    generate_day(store, DAY, scale=1.0)
    resources = {
        "storage": StorageResource(data_root=str(data)),
        "inference": InferenceResource(
            device="cpu", precision="fp32", max_batch_size=BATCH, shard_rows=0, cpu_threads=1
        ),
    }
    with DagsterInstance.from_config(str(home)) as instance:
        assert materialize([fraud_model], resources=resources, instance=instance).success
        baseline = materialize(
            [transactions, fraud_model, fraud_scores],
            partition_key=DAY,
            resources=resources,
            instance=instance,
        )
    assert baseline.success
    expected = store.read_output("fraud_scores", DAY).sort_by("transaction_id")
    env = {**os.environ, **SLOW, "NIGHTSHIFT_DATA_ROOT": str(data), "DAGSTER_HOME": str(home)}
    return {"store": store, "expected": expected, "env": env, "home": home}


def _launch(env: dict, log: Path) -> subprocess.Popen:
    command = [
        str(BIN / "dagster"), "job", "execute", "-m", "orchestration.definitions",
        "-j", "fraud_scoring_job", "--tags", json.dumps({"dagster/partition": DAY}),
    ]  # fmt: skip
    return subprocess.Popen(
        command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _progress(store: DataStore) -> dict | None:
    path = f"{store.path('outputs', 'fraud_scores', '_staging', f'date={DAY}')}/_progress.json"
    try:
        return json.loads(store.read_bytes(path))
    except (FileNotFoundError, OSError, ValueError):
        return None


def _wait_for_shards(process: subprocess.Popen, store: DataStore, shards: int) -> dict:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        progress = _progress(store)
        if progress is not None and len(progress["shards"]) >= shards:
            return progress
        assert process.poll() is None, "the run ended before the kill point"
        time.sleep(0.05)
    raise AssertionError(f"no progress with {shards} shards within 240 s")


def _wait_for_commit(process: subprocess.Popen, store: DataStore) -> dict:
    """Waits until every shard is written: the commit starts at once (progress then vanishes)."""
    seen: dict = {"shards": {}}
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        progress = _progress(store)
        if progress is None and seen["shards"]:
            return seen  # committing or committed: progress moved into the output
        if progress is not None:
            seen = progress
            if len(progress["shards"]) == SHARDS:
                return seen
    return seen


def _assert_matches_uninterrupted(world: dict) -> None:
    got = world["store"].read_output("fraud_scores", DAY).sort_by("transaction_id")
    expected = world["expected"]
    assert got.num_rows == expected.num_rows
    assert pc.count_distinct(got["transaction_id"]).as_py() == got.num_rows  # no duplicates
    assert got["transaction_id"].equals(expected["transaction_id"])
    diff = pc.max(pc.abs(pc.subtract(got["score"], expected["score"]))).as_py()
    mismatched = pc.sum(pc.not_equal(got["flagged"], expected["flagged"])).as_py()
    assert (diff, mismatched) == (0.0, 0), f"max score difference {diff}, {mismatched} flags"


def _largest_shard(store: DataStore) -> int:
    """Input rows of the day's biggest shard. Fraud shards hold whole accounts (crc32 of the
    account modulo the shard count), so one may hold more than SHARD_ROWS rows; the one shard
    computing when the node dies is all a retry redoes."""
    batches = store.iter_landing(TRANSACTIONS, DAY, TRANSACTIONS_SCHEMA, columns=["account_id"])
    shards = np.concatenate([account_shards(b.column(0), SHARDS) for b in batches])
    return int(np.bincount(shards, minlength=SHARDS).max())


def _latest_metadata(home: Path) -> dict:
    with DagsterInstance.from_config(str(home)) as instance:
        event = instance.get_latest_materialization_event(
            __import__("dagster").AssetKey("fraud_scores")
        )
    return {k: v.value for k, v in day_entries(event.asset_materialization.metadata).items()}


@pytest.mark.parametrize(
    ("kill", "after_shards"),
    [
        ("SIGTERM", 0),  # scoring started, no shard finished yet
        ("SIGTERM", 4),  # mid-partition
        ("SIGTERM", SHARDS),  # every shard finished: the commit is under way
        ("SIGKILL", 3),  # no notice at all
    ],
)
def test_interrupted_run_resumes_and_equals_an_uninterrupted_one(
    world, tmp_path, kill, after_shards
) -> None:
    store = world["store"]
    reset_outputs(store)
    process = _launch(world["env"], tmp_path / "interrupted.log")
    if after_shards == SHARDS:
        before = _wait_for_commit(process, store)
    else:
        before = _wait_for_shards(process, store, after_shards)
    if process.poll() is None:
        os.killpg(process.pid, getattr(signal, kill))
    code = process.wait(timeout=120)
    log = (tmp_path / "interrupted.log").read_text()
    stopped_while_scoring = "interrupted (SIGTERM received)" in log
    if kill == "SIGKILL":
        assert code == -signal.SIGKILL
    elif code == 0 or "RUN_SUCCESS" in log:
        # The signal landed after the run had succeeded: the work was done and published
        # whole. (`dagster job execute` then initialises the resources once more in its own
        # process; a SIGTERM landing there ends it with a non-zero status.)
        assert after_shards == SHARDS and "RUN_SUCCESS" in log
    elif stopped_while_scoring:
        assert not store.output_exists("fraud_scores", DAY)  # nothing partial published
    else:
        # The signal landed after the commit, while the step's checks and events ran: Dagster's
        # own interruption ended the run (it is not retried in a process that is going away),
        # and the partition it had published is whole (compared below, after the retry).
        assert after_shards == SHARDS and "RUN_FAILURE" in log, log[-3000:]
        assert re.search(r"InterruptedError|KeyboardInterrupt", log), log[-3000:]

    retry = _launch(world["env"], tmp_path / "retry.log")
    assert retry.wait(timeout=300) == 0, (tmp_path / "retry.log").read_text()[-3000:]
    _assert_matches_uninterrupted(world)
    meta = _latest_metadata(world["home"])
    assert meta["shards"] == SHARDS and meta["rows_redone"] <= _largest_shard(store)
    if kill == "SIGKILL" or stopped_while_scoring:
        assert meta["shards_resumed"] >= len(before["shards"])
    assert not store.exists(store.path("outputs", "fraud_scores", "_staging", f"date={DAY}"))


class FakeImds(BaseHTTPRequestHandler):
    """IMDSv2 on loopback: a token, then 404 for instance-action until a notice is posted."""

    notice: dict | None = None
    noticed_at: float | None = None
    on_first_notice = staticmethod(lambda: None)
    at_first_notice: dict | None = None
    calls: list[tuple[str, str, str | None]] = []

    def do_PUT(self) -> None:  # noqa: N802
        FakeImds.calls.append(
            ("PUT", self.path, self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"))
        )
        self._reply(200, b"token-1")

    def do_GET(self) -> None:  # noqa: N802
        token = self.headers.get("X-aws-ec2-metadata-token")
        FakeImds.calls.append(("GET", self.path, token))
        if token != "token-1":
            self._reply(401, b"")
        elif self.path.endswith("/spot/instance-action") and FakeImds.notice:
            if FakeImds.noticed_at is None:
                # What was finished at the instant the node learnt of the reclaim.
                FakeImds.noticed_at = time.monotonic()
                FakeImds.at_first_notice = FakeImds.on_first_notice()
            self._reply(200, json.dumps(FakeImds.notice).encode())
        else:
            self._reply(404, b"")

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def imds() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeImds)
    FakeImds.notice, FakeImds.noticed_at, FakeImds.calls = None, None, []
    FakeImds.at_first_notice = None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_spot_notice_mid_run_stops_the_run_which_resumes_on_retry(world, tmp_path, imds) -> None:
    store = world["store"]
    reset_outputs(store)
    poll = 0.2
    env = {**world["env"], "NIGHTSHIFT_SPOT_NOTICE": "aws", "NIGHTSHIFT_SPOT_ENDPOINT": imds,
           "NIGHTSHIFT_NOTICE_POLL_SECONDS": str(poll)}  # fmt: skip
    process = _launch(env, tmp_path / "noticed.log")
    _wait_for_shards(process, store, 2)
    FakeImds.on_first_notice = staticmethod(lambda: _progress(store))
    posted = time.monotonic()
    FakeImds.notice = {"action": "terminate", "time": "2026-03-02T02:00:00Z"}
    assert process.wait(timeout=120) != 0
    stopped = time.monotonic()
    log = (tmp_path / "noticed.log").read_text()
    assert "interrupted (aws spot terminate at 2026-03-02T02:00:00Z)" in log, log[-3000:]
    after, at_notice = _progress(store), FakeImds.at_first_notice
    # The notice is seen within one poll interval of being posted, and work stops at the next
    # batch boundary: at most the batch in flight when the notice was served could complete a
    # shard, never the rest of the partition.
    assert at_notice is not None and len(after["shards"]) <= len(at_notice["shards"]) + 1 < SHARDS
    assert after["interruptions"] == 1
    print(
        f"notice served {FakeImds.noticed_at - posted:.2f}s after it was posted (poll {poll}s); "
        f"run exited {stopped - FakeImds.noticed_at:.2f}s after that"
    )
    assert ("PUT", "/latest/api/token", "21600") in FakeImds.calls

    retry = _launch(world["env"], tmp_path / "retry.log")
    assert retry.wait(timeout=300) == 0, (tmp_path / "retry.log").read_text()[-3000:]
    _assert_matches_uninterrupted(world)
    assert _latest_metadata(world["home"])["shards_resumed"] == len(after["shards"])


def _run_worker_pid(instance: DagsterInstance, run_id: str) -> int | None:
    """The pid of the process executing the run, as its engine events report it."""
    for record in instance.all_logs(run_id):
        found = re.search(r"pid: (\d+)", record.message or "")
        if found and int(found.group(1)) != os.getpid():
            return int(found.group(1))
    return None


def _wait(probe, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_daemon_relaunches_a_terminated_run_which_resumes(world, tmp_path) -> None:
    from dagster import DagsterEventType, DagsterRunStatus, RunsFilter

    repo = Path(__file__).resolve().parents[1]
    store, home = world["store"], tmp_path / "home"
    reset_outputs(store)
    home.mkdir()
    (home / "dagster.yaml").write_text((repo / "deploy/local/dagster.yaml").read_text())
    env = {**world["env"], "DAGSTER_HOME": str(home)}
    # Create the SQLite storages once, before two processes race to migrate them.
    DagsterInstance.from_config(str(home)).dispose()
    daemon = subprocess.Popen(
        [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"],
        cwd=repo, env=env, stdout=(tmp_path / "daemon.log").open("w"),
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        launch = subprocess.run(
            [str(BIN / "dagster"), "job", "launch", "-w", "workspace.yaml", "-j",
             "fraud_scoring_job", "--tags", json.dumps({"dagster/partition": DAY})],
            cwd=repo, env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert launch.returncode == 0, launch.stderr[-3000:]
        with DagsterInstance.from_config(str(home)) as instance:
            [first] = instance.get_runs(limit=1)
            pid = _wait(lambda: _run_worker_pid(instance, first.run_id), 180, "the run worker")
            _wait(lambda: (_progress(store) or {"shards": {}})["shards"], 240, "a finished shard")
            os.kill(pid, signal.SIGTERM)

            def retried():
                runs = instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": first.run_id}))
                return (
                    runs
                    and runs[0].status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE)
                    and runs[0]
                )

            retry = _wait(retried, 300, "the daemon's retry run to finish")
            first = instance.get_run_by_id(first.run_id)
            assert first.status == DagsterRunStatus.FAILURE
            assert first.tags["nightshift/interrupted"] == "true"
            assert retry.status == DagsterRunStatus.SUCCESS, (tmp_path / "daemon.log").read_text()[
                -3000:
            ]
            assert retry.tags["dagster/retry_number"] == "1"
            started = {
                e.step_key
                for e in instance.all_logs(retry.run_id, of_type=DagsterEventType.STEP_START)
            }
            # FROM_FAILURE: the steps that had succeeded (validation, model) are not run again.
            assert "fraud_scores" in started and not started & {"transactions", "fraud_model"}
        _assert_matches_uninterrupted(world)
        meta = _latest_metadata(home)
        assert meta["shards_resumed"] >= 1 and meta["run_attempt"] == 2
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=60)
