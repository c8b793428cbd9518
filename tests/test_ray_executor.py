"""The ray executor: one day's shards on Ray actors, recorded and committed by the driver.

A real local Ray (two actors on this machine's cores) is started once for the module and stopped
after it. The fraud day is cut by account; its output must equal the local engine's bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from dagster import DagsterInstance, materialize
from fraud_world import trained_fraud_world
from helpers import asset_metadata
from ray_world import started_shards
from safetensors.torch import save_file

from assets.fraud.assets import fraud_alerts, fraud_scores, transactions
from assets.fraud.demo_data import generate_day
from assets.fraud.pipeline import scored_transactions
from assets.fraud.quality import screen_transactions
from assets.fraud.schemas import TRANSACTIONS, TRANSACTIONS_SCHEMA
from inference.engine.quarantine import RowConservationError
from inference.engine.ray_pool import RayPool, ray_session
from inference.engine.shard_worker import ModelStep, ShardJob
from inference.engine.shard_writer import ShardedWriter, ShardFileTargets
from inference.engine.shards import (
    Interrupted,
    Watch,
    WorkerFigures,
    row_range_shards,
    run_partition,
)
from inference.fraud.accounts import AccountShards, shard_count, shard_profile
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

TRAINED_ON = "2026-06-01"
DAY = "2026-06-02"
SCALE = 0.1  # 10,000 transactions
SHARD_ROWS = 1_500  # about 7 shards of accounts


@pytest.fixture(scope="module")
def ray():
    # Workers take their environment from the Ray start: the local S3 server's test
    # credentials (the ones `any_store` sets) must be there already.
    saved = dict(os.environ)
    os.environ.update(
        AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1"
    )
    try:
        with ray_session("", num_cpus=2, num_gpus=0) as session:
            yield session
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def fraud(tmp_path_factory) -> dict:
    world = trained_fraud_world(tmp_path_factory.mktemp("ray") / "data", TRAINED_ON, SCALE)
    store = world["store"]
    generate_day(store, DAY, scale=SCALE)
    table = store.read_landing(TRANSACTIONS, DAY, TRANSACTIONS_SCHEMA)
    # A few rows the contract refuses, so quarantine travels with the shards too.
    amount = table["amount"].to_numpy(zero_copy_only=False).copy()
    amount[[5, 500, 5000]] = -1.0
    table = table.set_column(table.schema.get_field_index("amount"), "amount", pa.array(amount))
    store.write_landing(TRANSACTIONS, DAY, table)
    return world


def _resources(fraud: dict, **inference) -> dict:
    return {
        **fraud["resources"],
        "inference": InferenceResource(
            device="cpu", precision="fp32", max_batch_size=512, shard_rows=SHARD_ROWS, **inference
        ),
    }


def _materialize(fraud: dict, **inference):
    config = {"ops": {"fraud_scores": {"config": {"max_quarantine_rate": 0.01}}}}
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [transactions, fraud_scores, fraud_alerts],
            partition_key=DAY,
            resources=_resources(fraud, **inference),
            instance=instance,
            run_config=config,
        )
    assert result.success
    return result


def _outputs(store) -> dict[str, pa.Table]:
    keys = {
        "fraud_scores": "transaction_id",
        "fraud_scores_quarantine": "row_number",
        "fraud_alerts": "transaction_id",
    }
    return {
        asset: store.read_output(asset, DAY).sort_by(key).combine_chunks()
        for asset, key in keys.items()
    }


def test_one_day_through_ray_equals_the_local_engine_bit_for_bit(fraud, ray) -> None:
    store = fraud["store"]
    _materialize(fraud)
    local = _outputs(store)
    result = _materialize(fraud, executor="ray")
    distributed = _outputs(store)
    for asset, table in local.items():
        assert distributed[asset].equals(table), asset
    scores = distributed["fraud_scores"]
    assert scores.num_rows == 10_000 - 3 and distributed["fraud_scores_quarantine"].num_rows == 3
    meta = asset_metadata(result, "fraud_scores")
    assert meta["executor"] == "ray" and meta["shards"] == meta["account_shards"] == 7
    assert meta["workers"] == 2 and meta["worker_model_loads"] == 2
    assert meta["rows_in"] == 10_000 and meta["rows_redone"] == 0
    assert pc.all(pc.equal(scores["model_version"], scores["model_version"][0])).as_py()
    assert np.isfinite(scores["score"].to_numpy()).all()


# The engine itself, on a toy model slow enough to be caught mid-shard.

SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64())])
ROWS, ENGINE_SHARD_ROWS = 1_200, 200


@dataclass(frozen=True)
class SlowDouble:
    """Doubles ids, ``seconds`` per model call of 50 rows: a shard takes 4 calls."""

    seconds: float

    def __call__(self, rows: pa.Table) -> ModelStep:
        def transform(batch: pa.RecordBatch, prepared) -> pa.Table:
            time.sleep(self.seconds)
            ids = batch["id"].to_numpy()
            return pa.table({"id": ids, "y": ids * 2.0})

        return ModelStep(transform)


def _engine_writer(store: DataStore, lineage: str = "run-a") -> ShardedWriter:
    target = store.partition_target("out", "2026-03-01")
    return ShardedWriter(ShardFileTargets(target, SCHEMA), "fp", ENGINE_SHARD_ROWS, lineage)


def _engine_input() -> list[pa.RecordBatch]:
    ids = np.arange(ROWS)
    return [pa.record_batch({"id": ids[i : i + 130]}) for i in range(0, ROWS, 130)]


def _engine_job(writer: ShardedWriter, seconds: float) -> ShardJob:
    return ShardJob(writer.files(), SlowDouble(seconds), batch_size=50)


def test_a_killed_ray_worker_costs_at_most_its_shard_and_is_counted(ray, any_store) -> None:
    store = any_store
    ray_module = pytest.importorskip("ray")
    ray_module.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pool = RayPool(ray, workers=2, cpus_per_worker=1, gpus_per_worker=0)
    killed: list[int] = []

    def kill_the_first_worker_seen() -> None:
        """Kills the worker of the first shard seen started and not yet recorded."""
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            recorded = writer.progress.shards
            for marker in started_shards(store, "out", "2026-03-01"):
                if str(marker["shard"]) in recorded:
                    continue
                pid = int(marker["worker"].rsplit(":", 1)[1])
                os.kill(pid, signal.SIGKILL)  # a reclaimed spot node: no notice, no cleanup
                killed.append(pid)
                break
            time.sleep(0.01)

    writer = _engine_writer(store)
    killer = threading.Thread(target=kill_the_first_worker_seen)
    killer.start()
    try:
        figures = WorkerFigures()
        report = run_partition(
            writer,
            lambda: row_range_shards(_engine_input(), ENGINE_SHARD_ROWS),
            # 0.8 s a shard: the kill lands inside the shard it was aimed at
            _engine_job(writer, seconds=0.2),
            pool,
            Watch(figures=figures),
        )
    finally:
        killer.join()
        pool.close()
    assert killed, "no worker was seen starting a shard"
    out = store.read_output("out", "2026-03-01").sort_by("id")
    assert out["id"].to_pylist() == list(range(ROWS))
    assert out["y"].to_pylist() == [2.0 * i for i in range(ROWS)]
    # Exactly the shard the killed worker was computing was redone, and it is counted.
    assert report.rows_redone == ENGINE_SHARD_ROWS and figures.shards_redone == 1
    assert report.shards == ROWS // ENGINE_SHARD_ROWS and report.rows_out == ROWS
    assert str(killed[0]) not in {w.rsplit(":", 1)[1] for w in figures.shards}


DRIVER = """
import sys, time
sys.path.insert(0, {tests!r})
import ray
import test_ray_executor as t
from inference.engine.shards import row_range_shards, run_partition
from inference.engine.quarantine import RowConservationError
from inference.engine.ray_pool import RayPool, ray_session
from inference.engine.shards import Interrupted
from resources.storage import DataStore, StorageResource

with ray_session("", num_cpus=2, num_gpus=0) as session:
    ray.cloudpickle.register_pickle_by_value(t)
    store = DataStore({root!r})
    writer = t._engine_writer(store)
    pool = RayPool(session, workers=2, cpus_per_worker=1, gpus_per_worker=0)
    run_partition(
        writer,
        lambda: row_range_shards(t._engine_input(), t.ENGINE_SHARD_ROWS),
        t._engine_job(writer, seconds=0.25),
        pool,
    )
"""


def test_a_killed_driver_is_resumed_from_its_finished_shards(ray, store, data_root) -> None:
    ray_module = pytest.importorskip("ray")
    ray_module.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    script = DRIVER.format(tests=str(Path(__file__).parent), root=str(data_root))
    driver = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    progress = Path(store.partition_target("out", "2026-03-01").staging_dir) / "_progress.json"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and driver.poll() is None:
            done = json.loads(progress.read_text())["shards"] if progress.exists() else {}
            if len(done) >= 2:
                break
            time.sleep(0.05)
        assert driver.poll() is None, "the driver finished before it could be killed"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's node is gone, its Ray with it
        driver.wait()
    finished = len(json.loads(progress.read_text())["shards"])
    assert 2 <= finished < ROWS // ENGINE_SHARD_ROWS
    pool = RayPool(ray, workers=2, cpus_per_worker=1, gpus_per_worker=0)
    try:
        writer = _engine_writer(store)  # the retry: same lineage, takes its lease over at once
        report = run_partition(
            writer,
            lambda: row_range_shards(_engine_input(), ENGINE_SHARD_ROWS),
            _engine_job(writer, seconds=0.0),
            pool,
        )
    finally:
        pool.close()
    out = store.read_output("out", "2026-03-01").sort_by("id")
    assert out["y"].to_pylist() == [2.0 * i for i in range(ROWS)]
    assert report.shards_resumed == finished and report.attempt == 2
    # The shards the dead driver's workers had started are counted as redone, no more.
    assert 0 < report.rows_redone <= 2 * ENGINE_SHARD_ROWS


def _profile_bytes(profile) -> int:
    return sum(
        value.nbytes
        for value in vars(profile).values()
        if isinstance(value, (np.ndarray, pa.Array))
    )


def test_a_shards_profile_stays_bounded_when_the_day_grows_tenfold_in_rows_and_accounts(
    store,
) -> None:
    """The state a worker builds follows its shard: at 10x the rows and accounts (and the same
    rows per shard) the largest shard profile stays about the same, the whole-day one grows 10x."""
    sizes = {}
    for date, scale in {"2026-03-01": 0.1, "2026-03-02": 1.0}.items():
        generate_day(store, date, scale=scale)
        screen = screen_transactions(store, date, build_profile=True)
        whole = screen.profile()
        day = AccountShards(shard_count(screen.plan.rows, 2_000), screen.plan)
        try:
            figures = day.write(scored_transactions(store, date))
            shards = [shard_profile(s.rows, figures) for s in day.inputs()]
        finally:
            day.close()
        sizes[scale] = {
            "accounts": len(whole.accounts),
            "whole": _profile_bytes(whole),
            "largest_shard": max(_profile_bytes(p) for p in shards),
            "largest_shard_accounts": max(len(p.accounts) for p in shards),
            "shards": len(shards),
        }
    small, large = sizes[0.1], sizes[1.0]
    print(sizes)
    assert large["accounts"] >= 8 * small["accounts"] and large["shards"] >= 8 * small["shards"]
    assert large["whole"] >= 8 * small["whole"]  # what one process held before
    assert large["largest_shard"] <= 1.3 * small["largest_shard"]
    assert large["largest_shard_accounts"] <= 1.3 * small["largest_shard_accounts"]


@dataclass(frozen=True)
class DropsARow:
    """A model step that answers for one row fewer than it was given."""

    def __call__(self, rows: pa.Table) -> ModelStep:
        return ModelStep(
            lambda batch, prepared: pa.table(
                {"id": batch["id"][1:], "y": [0.0] * (batch.num_rows - 1)}
            )
        )


def test_a_shards_own_error_reaches_the_driver_and_nothing_is_committed(ray, store) -> None:
    ray_module = pytest.importorskip("ray")
    ray_module.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pool = RayPool(ray, workers=2, cpus_per_worker=1, gpus_per_worker=0)
    writer = _engine_writer(store)
    try:
        with pytest.raises(RowConservationError, match="answered for 49 rows but was given 50"):
            run_partition(
                writer,
                lambda: row_range_shards(_engine_input(), ENGINE_SHARD_ROWS),
                ShardJob(writer.files(), DropsARow(), batch_size=50),
                pool,
            )
    finally:
        pool.close()
    assert not store.output_exists("out", "2026-03-01")


def test_an_interrupted_driver_cancels_its_shards_and_the_retry_resumes(ray, store) -> None:
    ray_module = pytest.importorskip("ray")
    ray_module.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pool = RayPool(ray, workers=2, cpus_per_worker=1, gpus_per_worker=0)
    writer = _engine_writer(store)

    def stop() -> str | None:  # SIGTERM once two shards are recorded
        return "SIGTERM received" if len(writer.progress.shards) >= 2 else None

    try:
        with pytest.raises(Interrupted) as err:
            run_partition(
                writer,
                lambda: row_range_shards(_engine_input(), ENGINE_SHARD_ROWS),
                _engine_job(writer, seconds=0.05),
                pool,
                Watch(stop),
            )
        assert not store.output_exists("out", "2026-03-01")
        retry = _engine_writer(store)
        report = run_partition(
            retry,
            lambda: row_range_shards(_engine_input(), ENGINE_SHARD_ROWS),
            _engine_job(retry, seconds=0.0),
            pool,
        )
    finally:
        pool.close()
    out = store.read_output("out", "2026-03-01").sort_by("id")
    assert out["y"].to_pylist() == [2.0 * i for i in range(ROWS)]
    assert report.shards_resumed == err.value.shards_done >= 2
    assert report.interruptions == 1 and report.attempt == 2


CLIENT = """
import sys
sys.path.insert(0, {tests!r})
import ray
import test_ray_executor as t
from inference.engine.shards import row_range_shards, run_partition
from inference.engine.ray_pool import RayPool, ray_session
from resources.storage import DataStore, StorageResource

for n, address in enumerate(sys.argv[1:]):
    with ray_session(address, num_cpus=2, num_gpus=0) as session:
        ray.cloudpickle.register_pickle_by_value(t)
        assert not session.get_runtime_context().get_node_id() is None
        store = DataStore({root!r})
        writer = t._engine_writer(store, lineage=f"run-{{n}}")
        pool = RayPool(session, workers=2, cpus_per_worker=1, gpus_per_worker=0)
        report = run_partition(
            writer,
            lambda: row_range_shards(t._engine_input(), t.ENGINE_SHARD_ROWS),
            t._engine_job(writer, seconds=0.0),
            pool,
        )
        pool.close()
        out = store.read_output("out", "2026-03-01").sort_by("id")
        assert out["y"].to_pylist() == [2.0 * i for i in range(t.ROWS)]
        print(address, "shards", report.shards, flush=True)
    assert not ray.is_initialized()  # disconnected; the cluster itself keeps running
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_run_joins_an_existing_cluster_by_its_address(data_root) -> None:
    """A Ray cluster started apart from nightshift (`ray start --head`, as on a head node):
    the driver connects to it by its GCS address (what `auto` resolves to on a cluster node),
    runs a day's shards there, and disconnects, leaving the cluster running. (Ray Client,
    `ray://`, is the same code path through `ray.init`; it is slower to start and was checked
    by hand, see deploy/ray/README.md.)"""
    gcs, client = _free_port(), _free_port()
    ray_cli = Path(sys.executable).parent / "ray"
    head = subprocess.Popen(
        [
            str(ray_cli),
            "start",
            "--head",
            f"--port={gcs}",
            f"--ray-client-server-port={client}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--block",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        script = CLIENT.format(tests=str(Path(__file__).parent), root=str(data_root))
        # Ray 2.60 clusters require their token; a driver sends it when told to (here the
        # head's ~/.ray/auth_token, on this machine; see deploy/ray/README.md).
        env = {**os.environ, "RAY_AUTH_MODE": "token"}
        done = subprocess.run(
            [sys.executable, "-c", script, f"127.0.0.1:{gcs}"],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"127.0.0.1:{gcs} shards 6" in done.stdout
        # The cluster outlived the driver's session.
        assert head.poll() is None
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # the head and its processes
        try:
            head.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


def test_the_own_model_example_runs_unchanged_on_ray(ray, store, tmp_path) -> None:
    """docs/your-own-model.md's example under the ray executor: its functions are shipped to
    the actors as they are, and the day is the same as on the local engine."""
    import churn_world as doc

    landed = {date: doc.land(store, date, seed) for seed, date in enumerate(doc.DAYS)}
    torch.manual_seed(0)
    weights = tmp_path / "churn_mlp.safetensors"
    save_file(doc.churn_mlp().state_dict(), weights)
    day = doc.DAYS[0]
    storage = {"storage": StorageResource(data_root=str(store.root))}
    outputs = {}
    for executor in ("local", "ray"):
        resources = {
            **storage,
            "inference": InferenceResource(
                device="cpu", precision="fp32", executor=executor, shard_rows=200
            ),
        }
        with DagsterInstance.ephemeral() as instance:
            result = doc.run(resources, instance, weights, day)
        assert result.success
        # The predictor loads where its shards run: once in the step's process, or once on
        # each Ray actor and never in the driver's step.
        loads = 0 if executor == "ray" else 1
        doc.assert_day(store, result, day, landed[day], weights, model_loads=loads)
        outputs[executor] = store.read_output(doc.ASSET, day).sort_by("customer_id")
        meta = asset_metadata(result, doc.ASSET, day)
    assert outputs["ray"].equals(outputs["local"])
    assert meta["executor"] == "ray" and meta["shard_layout"] == "row_ranges"
    assert meta["shards"] == 4 and meta["workers"] == 2 and meta["worker_model_loads"] == 2


@dataclass(frozen=True)
class Times:
    factor: float

    def __call__(self, rows: pa.Table) -> ModelStep:
        def transform(batch: pa.RecordBatch, prepared) -> pa.Table:
            ids = batch["id"].to_numpy()
            return pa.table({"id": ids, "y": ids * self.factor})

        return ModelStep(transform)


def test_one_pool_computes_each_day_of_a_range_with_that_days_job(ray, store) -> None:
    """A range backfill drives several days through the same actors: each day's shards are
    computed with its own job, never with the day before's."""
    ray_module = pytest.importorskip("ray")
    ray_module.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pool = RayPool(ray, workers=2, cpus_per_worker=1, gpus_per_worker=0)
    days = {"2026-03-01": 2.0, "2026-03-02": 3.0, "2026-03-03": 5.0}
    try:
        for day, factor in days.items():
            target = store.partition_target("out", day)
            where = ShardFileTargets(target, SCHEMA)
            writer = ShardedWriter(where, f"fp-{day}", ENGINE_SHARD_ROWS, "run-a")
            run_partition(
                writer,
                lambda: row_range_shards(_engine_input(), ENGINE_SHARD_ROWS),
                ShardJob(writer.files(), Times(factor), batch_size=50),
                pool,
            )
    finally:
        pool.close()
    for day, factor in days.items():
        out = store.read_output("out", day).sort_by("id")
        assert out["y"].to_pylist() == [factor * i for i in range(ROWS)], day
