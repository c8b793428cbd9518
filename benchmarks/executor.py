"""Workload 8: one fraud partition scored by the local engine against Ray with two workers.

Both score the same day through ``materialize`` of ``fraud_scores`` with the same model, in the
same process and the same minutes, alternating, best of N. The landing checks ran once before
(untimed), so both reuse the day's saved screen as the job does. The Ray session is started by
the workload and stopped after, and timed apart from the runs: a step with no Ray address
starts and stops one itself (``ray_session``), so the figure with it added is reported too. The
workers' actors are created inside each run, as in production, so their start (torch import,
model load) is part of the Ray figure.

Last, one more Ray run with a worker killed (SIGKILL, as a reclaimed spot node) in the middle of
a shard: the output must still equal the local engine's, and the rows redone are compared with
the killed shard's rows.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
from dagster import AssetKey, DagsterInstance, materialize

from assets.day_metadata import day_figures
from assets.fraud.assets import fraud_scores
from assets.fraud.schemas import FLAGGED, SCORES
from benchmarks.common import QUIET_RUN_CONFIG, Workload, timed
from benchmarks.fraud_data import landed_day
from inference.engine.output_partition import PROGRESS
from inference.engine.shard_worker import RUNNING_DIR
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

DAY = "2026-03-01"
WORKERS = 2
# Output columns compared between the executors, sorted by transaction id.
SORT_KEYS = {SCORES: "transaction_id", FLAGGED: "transaction_id"}


@contextmanager
def private_ray() -> Iterator[str]:
    """A Ray temp folder for this workload alone, set in the environment while it runs.

    The workload's local Ray sessions (sockets, logs) then live in a folder of their own,
    deleted after, and a bare ``ray.init()`` cannot see a cluster that ``ray start`` recorded
    in ``/tmp/ray/ray_current_cluster`` (another session's, on a shared machine): before
    ``ray_session`` asked for ``address="local"``, it joined that one and failed with "When
    connecting to an existing cluster, num_cpus and num_gpus must not be provided".
    ``RAY_ADDRESS`` is dropped for the same reason.
    """
    folder = tempfile.mkdtemp(prefix="nsray-")  # short: Ray's socket paths live under it
    saved = {name: os.environ.get(name) for name in ("RAY_TMPDIR", "RAY_ADDRESS")}
    os.environ["RAY_TMPDIR"] = folder
    os.environ.pop("RAY_ADDRESS", None)
    try:
        yield folder
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(folder, ignore_errors=True)


def _resources(
    root: Path, executor: str, threads: int, batch_size: int, shard_rows: int, **inference: Any
) -> dict[str, Any]:
    return {
        "storage": StorageResource(data_root=str(root)),
        "inference": InferenceResource(
            device="cpu",
            precision="fp32",
            cpu_threads=threads,
            max_batch_size=batch_size,
            shard_rows=shard_rows,
            executor=executor,
            ray_workers=WORKERS,
            ray_cpus_per_worker=1,
            **inference,
        ),
    }


def score(
    root: Path, executor: str, threads: int, batch_size: int, shard_rows: int, **inference: Any
) -> tuple[float, dict]:
    """Materialises ``fraud_scores`` for the day (``inference``: more of the inference
    resource's settings); returns (wall seconds, its metadata)."""
    with DagsterInstance.ephemeral() as instance:
        result, seconds = timed(
            lambda: materialize(
                [fraud_scores],
                partition_key=DAY,
                resources=_resources(root, executor, threads, batch_size, shard_rows, **inference),
                instance=instance,
                run_config=QUIET_RUN_CONFIG,
            )
        )
        if not result.success:
            raise RuntimeError(f"fraud_scores failed for {DAY} on executor {executor}")
        for event in result.get_asset_materialization_events():
            mat = event.event_specific_data.materialization
            if mat.asset_key == AssetKey(SCORES):
                return seconds, day_figures(mat.metadata)
    raise RuntimeError(f"no materialisation of {SCORES} on executor {executor}")


def outputs(root: Path) -> dict[str, pa.Table]:
    """The day's scores and flagged details, sorted by transaction id."""
    store = DataStore(str(root))
    return {
        asset: store.read_output(asset, DAY).sort_by(key).combine_chunks()
        for asset, key in SORT_KEYS.items()
    }


def same(a: dict[str, pa.Table], b: dict[str, pa.Table]) -> bool:
    return all(a[asset].equals(b[asset]) for asset in SORT_KEYS)


def cut_seconds(root: Path, shard_rows: int) -> float:
    """The Ray driver's own pass, timed alone: the day cut into account shards (each row
    written to its shard's file, the day-wide sums) and the shards read back."""
    from assets.fraud.pipeline import scored_transactions
    from assets.fraud.quality import load_screen
    from inference.fraud.accounts import AccountShards, shard_count

    store = DataStore(str(root))
    plan = load_screen(store, DAY)
    began = time.perf_counter()
    shards = AccountShards(shard_count(plan.rows - plan.count, shard_rows), plan)
    try:
        shards.write(scored_transactions(store, DAY))
        for _ in shards.inputs():
            pass
    finally:
        shards.close()
    return time.perf_counter() - began


class WorkerKiller:
    """Kills the Ray worker computing a shard, once, soon after the shard starts.

    It watches the staging ``_running/`` markers (written by a worker as it starts a shard,
    with ``"worker": "host:pid"``) and the progress file (shards the driver recorded), and
    kills the worker of a shard that started in the last ``fresh`` seconds and is not
    recorded: a worker lost mid-shard, with no notice.
    """

    def __init__(self, root: Path, fresh: float = 0.2, timeout: float = 300.0):
        staging = Path(DataStore(str(root)).partition_target(SCORES, DAY).staging_dir)
        self.markers, self.progress = staging / RUNNING_DIR, staging / PROGRESS
        self.fresh, self.timeout = fresh, timeout
        self.killed: dict | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> WorkerKiller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _recorded(self) -> set[int]:
        try:
            return {int(k) for k in json.loads(self.progress.read_text())["shards"]}
        except (OSError, ValueError, KeyError):
            return set()

    def _watch(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self._done.is_set() and time.monotonic() < deadline:
            for path in self.markers.glob("*.json") if self.markers.exists() else []:
                try:
                    age = time.time() - path.stat().st_mtime
                    marker = json.loads(path.read_text())
                except (OSError, ValueError):  # being written
                    continue
                # shard-NNNNN.parquet.json
                index = int(path.name.split(".", 1)[0].rsplit("-", 1)[1])
                if age > self.fresh or index in self._recorded():
                    continue
                pid = int(marker["worker"].rsplit(":", 1)[1])
                os.kill(pid, signal.SIGKILL)
                self.killed = {"shard": index, "shard_rows": marker["rows"], "pid": pid}
                return
            time.sleep(0.01)


def _ray_figures(meta: dict) -> dict:
    keys = (
        "workers",
        "worker_shards",
        "worker_peak_rss_mib",
        "worker_model_loads",
        "account_shards",
        "shards",
        "rows_redone",
        "shards_redone_by_workers",
    )
    return {k: meta.get(k) for k in keys}


def run(
    work: Path, rows: int, threads: int, batch_size: int, shard_rows: int, repeats: int = 3
) -> Workload:
    from inference.engine.ray_pool import RayPool, ray_session

    w = Workload("8 executor")
    root = work / "executor"
    rows = landed_day(root, DAY, rows, threads)

    with private_ray(), ExitStack() as stack:
        began = time.perf_counter()
        ray = stack.enter_context(ray_session("", num_cpus=WORKERS, num_gpus=0))
        ray_start = time.perf_counter() - began
        try:
            # What creating a run's actors costs alone (process, torch import), then gone.
            pool, began = RayPool(ray, WORKERS, 1, 0), time.perf_counter()
            pool.pids()
            actor_start = time.perf_counter() - began
            pool.close()

            # Warm-up of both (imports, page cache); their outputs are the ones compared.
            score(root, "local", threads, batch_size, shard_rows)
            local_out = outputs(root)
            score(root, "ray", threads, batch_size, shard_rows)
            equal = same(local_out, outputs(root))
            local_runs: list[float] = []
            ray_runs: list[float] = []
            # The engine's own time for the partition (metadata `seconds`), checks excluded.
            engine: dict[str, list[float]] = {"local": [], "ray": []}
            meta: dict = {}
            for _ in range(repeats):  # alternated, so both see the same load
                seconds, local_meta = score(root, "local", threads, batch_size, shard_rows)
                local_runs.append(seconds)
                engine["local"].append(local_meta["seconds"])
                seconds, meta = score(root, "ray", threads, batch_size, shard_rows)
                ray_runs.append(seconds)
                engine["ray"].append(meta["seconds"])
            equal = equal and same(local_out, outputs(root))
            cut = min(cut_seconds(root, shard_rows) for _ in range(repeats))

            with WorkerKiller(root) as killer:
                killed_seconds, killed_meta = score(root, "ray", threads, batch_size, shard_rows)
            killed_equal = same(local_out, outputs(root))
        finally:
            began = time.perf_counter()
            stack.close()
            ray_stop = time.perf_counter() - began

    local, distributed = min(local_runs), min(ray_runs)
    w.facts.update(
        rows=rows,
        shard_rows=shard_rows,
        threads=threads,
        batch_size=batch_size,
        repeats=repeats,
        ray_workers=WORKERS,
        ray_cpus_per_worker=1,
        local_seconds=[round(s, 3) for s in local_runs],
        ray_seconds=[round(s, 3) for s in ray_runs],
        engine_seconds=engine,
        ray_session_start_seconds=round(ray_start, 2),
        ray_session_stop_seconds=round(ray_stop, 2),
        ray_actor_start_seconds=round(actor_start, 2),
        ray_driver_cut_seconds=round(cut, 3),
        outputs_equal=equal,
        compared=f"{SCORES} and {FLAGGED}, all columns, sorted by transaction_id",
        ray=_ray_figures(meta),
        killed_worker={
            **(killer.killed or {"shard": None}),
            "seconds": round(killed_seconds, 3),
            "outputs_equal": killed_equal,
            **_ray_figures(killed_meta),
        },
    )
    shards = meta.get("shards", 0)
    w.compare(
        f"ray, {WORKERS} workers of 1 CPU ({shards} account shards)",
        "local engine, 1 thread",
        rows / distributed,
        rows / local,
        "rows/s",
        True,
        None,
        f"fraud_scores through materialize, best of {repeats} alternated; outputs equal: "
        f"{equal}; the Ray session (started {ray_start:.1f} s, stopped {ray_stop:.1f} s) not "
        f"counted; counted: 2 actors start in {actor_start:.1f} s, the driver cuts the day "
        f"into shards in {cut:.1f} s",
    )
    w.compare(
        f"ray, {WORKERS} workers, with a Ray session started and stopped for the step",
        "local engine, 1 thread",
        rows / (distributed + ray_start + ray_stop),
        rows / local,
        "rows/s",
        True,
        None,
        "what a `dagster job execute` with NIGHTSHIFT_EXECUTOR=ray and no address pays",
    )
    if killer.killed is None:
        raise RuntimeError("no worker was seen starting a shard: the kill did not happen")
    redone = killed_meta.get("rows_redone", 0)
    w.compare(
        "rows redone after one worker was killed mid-shard",
        f"rows of the killed shard (shard {killer.killed['shard']})",
        redone,
        killer.killed["shard_rows"],
        "rows",
        False,
        1.0,
        f"target: at most the killed shard is redone (ratio >= 1); outputs equal: "
        f"{killed_equal}; run {killed_seconds:.1f} s against {distributed:.1f} s unkilled",
    )
    return w
