"""One partition through the ray executor against the local engine, in one process.

Synthetic tabular rows (``--rows`` x ``--features`` float32 columns and an id) are scored by a
random MLP of the fraud model's shape through :class:`~inference.tabular.tabular.TabularScorer`, once
in this process (:func:`inference.engine.local_pool.run_local`), then on a
:class:`~inference.engine.ray_pool.RayPool` of
GPUs x k actors for each k of ``--workers-per-gpu`` (each actor holding ``1 / k`` of a GPU),
with the same shards, model calls and partition writer. Reported: rows/s of each, the ratio to
the local engine, and whether each published partition holds the local one's ids and scores
bit for bit.

It needs torch, numpy, pyarrow and ray only (no Dagster, no great-expectations): what the lent
GPU machine has once benchmarks/ray_wheels.sh's wheels are installed (benchmarks/gpu.sh does
that). Each engine first scores a small warm-up partition, so the timed runs leave out Ray's
start, each worker's CUDA start and model load (reported apart).

    python -m benchmarks.ray_gpu --device cpu --rows 200000       # here, on the CPU
    python -m benchmarks.ray_gpu --device cuda --rows 4000000     # a CUDA machine
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from benchmarks.common import Workload, _cpu_name
from inference.engine.device import make_runtime
from inference.engine.local_pool import run_local as run_in_process
from inference.engine.metrics import BatchMetrics, peak_rss_mb
from inference.engine.ray_pool import RayPool, ray_session
from inference.engine.shard_worker import FixedProgram, ModelStep, ShardJob, worker_model
from inference.engine.shard_writer import ShardedWriter, ShardFileTargets
from inference.engine.shards import (
    WAIT_SECONDS,
    Watch,
    WorkerFigures,
    row_range_shards,
    run_partition,
)
from inference.tabular.tabular import Standardizer, TabularScorer, build_mlp
from inference.tabular.tabular_model import stack_features
from resources.datastore import DataStore

REPO = Path(__file__).resolve().parents[1]
SCHEMA = pa.schema([("id", pa.int64()), ("score", pa.float32())])
READ_BATCH = 65_536  # rows per input batch, as a parquet reader hands them over
MODEL_KEY = "ray_gpu_mlp"
WARM, DAY = "2026-01-01", "2026-01-02"  # the warm-up partition, the timed one


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda or cpu")
    parser.add_argument("--precision", default="fp32", help="fp32 or bf16 (GPU)")
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--features", type=int, default=15)
    parser.add_argument("--hidden", default="64,32", help="hidden widths (the fraud model's)")
    parser.add_argument(
        "--shard-rows", type=int, help="rows per shard (default: 2 per worker, whole model calls)"
    )
    parser.add_argument("--batch-size", type=int, default=65_536, help="rows per model call")
    parser.add_argument(
        "--workers-per-gpu", default="2", help="k, actors per GPU; a list (1,2,4) runs each"
    )
    parser.add_argument(
        "--workers", help="actors, overriding GPUs x k (a list runs each; default 2 on the CPU)"
    )
    parser.add_argument(
        "--threads", type=int, help="CPU threads in all (default: the cores, at most 16)"
    )
    parser.add_argument("--out", type=Path, help="folder for results.json/.md (default: none)")
    return parser.parse_args(argv)


@dataclass(frozen=True)
class MlpLoader:
    """Builds the scorer in the process that calls it (picklable: weights as numpy arrays)."""

    weights: dict[str, np.ndarray]
    hidden: tuple[int, ...]
    mean: np.ndarray
    std: np.ndarray
    device: str
    precision: str

    def __call__(self) -> TabularScorer:
        model = build_mlp(len(self.mean), self.hidden)
        model.load_state_dict({k: torch.from_numpy(v) for k, v in self.weights.items()})
        names = feature_names(len(self.mean))
        runtime = make_runtime(self.device, self.precision)
        return TabularScorer(model, Standardizer(self.mean, self.std), names, 0.5, runtime)


@dataclass(frozen=True)
class Scoring:
    """The model step of both engines: features stacked in ``prepare``, scored in batches of
    ``batch_size`` (the last one padded to that shape, so a row's score does not depend on its
    call's other rows)."""

    loader: MlpLoader
    batch_size: int

    def prepare(self, batch: pa.RecordBatch) -> np.ndarray:
        return stack_features(batch, feature_names(len(self.loader.mean)))

    def transform(self, batch: pa.RecordBatch, x: np.ndarray) -> pa.Table:
        scorer = worker_model(MODEL_KEY, self.loader)  # loaded once per process
        scores = scorer.score(x, max_rows=self.batch_size)
        return pa.table({"id": batch["id"], "score": pa.array(scores, pa.float32())})

    def functions(self) -> ModelStep:
        return ModelStep(self.transform, prepare=self.prepare)


def feature_names(count: int) -> list[str]:
    return [f"f{i:02d}" for i in range(count)]


def synthetic_rows(rows: int, features: int, seed: int = 0) -> list[pa.RecordBatch]:
    """Shuffled ids and float32 features with a spread of scales, in read-sized batches."""
    rng = np.random.default_rng(seed)
    ids = rng.permutation(rows).astype(np.int64)
    scale = np.geomspace(0.1, 100.0, features).astype(np.float32)
    x = rng.standard_normal((rows, features), dtype=np.float32) * scale
    names = feature_names(features)
    return [
        pa.record_batch(
            [pa.array(ids[i : i + READ_BATCH])]
            + [pa.array(x[i : i + READ_BATCH, j]) for j in range(features)],
            names=["id", *names],
        )
        for i in range(0, rows, READ_BATCH)
    ]


def random_model(features: int, hidden: tuple[int, ...], sample: np.ndarray, args) -> MlpLoader:
    torch.manual_seed(0)
    mlp = build_mlp(features, hidden)
    weights = {k: v.detach().numpy().copy() for k, v in mlp.state_dict().items()}
    fitted = Standardizer.fit(sample)
    return MlpLoader(weights, hidden, fitted.mean, fitted.std, args.device, args.precision)


def _writer(store: DataStore, asset: str, date: str, shard_rows: int) -> ShardedWriter:
    where = ShardFileTargets(store.partition_target(asset, date), SCHEMA)
    return ShardedWriter(where, "ray-gpu", shard_rows, "bench")


def run_local(store, asset, date, batches, scoring, shard_rows) -> tuple[float, BatchMetrics]:
    """Seconds for one partition through the local engine, commit included, and its phases."""
    writer = _writer(store, asset, date, shard_rows)
    metrics = BatchMetrics()
    began = time.perf_counter()
    run_in_process(
        writer, batches, scoring.functions(), scoring.batch_size, watch=Watch(metrics=metrics)
    )
    return time.perf_counter() - began, metrics


def run_ray(store, asset, date, batches, scoring, shard_rows, pool):
    """Seconds for one partition through the ray executor, commit included, the workers'
    figures and the phases (the workers' summed, the driver's reading)."""
    writer = _writer(store, asset, date, shard_rows)
    job = ShardJob(writer.files(), FixedProgram(scoring.functions()), scoring.batch_size)
    figures, metrics = WorkerFigures(), BatchMetrics()
    began = time.perf_counter()
    run_partition(
        writer,
        lambda: row_range_shards(batches, shard_rows),
        job,
        pool,
        Watch(metrics=metrics, figures=figures),
    )
    return time.perf_counter() - began, figures, metrics


def phases(metrics: BatchMetrics) -> dict[str, float]:
    return {k: round(v, 3) for k, v in metrics.phase_seconds.items()}


def compare(store: DataStore, asset: str) -> dict[str, Any]:
    """The local and the Ray partition, sorted by id: equal ids, equal scores bit for bit."""
    local = store.read_output("local", DAY).sort_by("id").combine_chunks()
    ray = store.read_output(asset, DAY).sort_by("id").combine_chunks()
    same_ids = local["id"].equals(ray["id"])
    diff = (
        np.abs(local["score"].to_numpy() - ray["score"].to_numpy())
        if same_ids
        else np.array([np.inf])
    )
    return {
        "rows_local": local.num_rows,
        "rows_ray": ray.num_rows,
        "ids_equal": same_ids,
        "scores_equal": bool(same_ids and local.equals(ray)),
        "scores_differing": int((diff != 0).sum()),
        "max_abs_difference": float(diff.max()) if diff.size else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        sys.exit("no CUDA device visible: use --device cpu")
    gpus = torch.cuda.device_count() if cuda else 0
    if args.workers:
        counts = [int(n) for n in args.workers.split(",")]
    else:
        counts = [gpus * int(k) for k in args.workers_per_gpu.split(",")] if cuda else [2]
    threads = args.threads or min(len(os.sched_getaffinity(0)), 16)
    hidden = tuple(int(h) for h in args.hidden.split(","))
    # Two shards for each worker of the largest pool: one computing, one on its way. The same
    # shards (and so the same model calls) for every run, so the outputs can be compared.
    calls = -(-args.rows // (2 * max(counts) * args.batch_size))
    shard_rows = args.shard_rows or max(1, calls) * args.batch_size
    # Ray's workers import nightshift from the checkout: it is not installed on a lent machine.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    torch.set_num_threads(threads)
    load = [round(x, 2) for x in os.getloadavg()]

    began = time.perf_counter()
    batches = synthetic_rows(args.rows, args.features)
    sample = stack_features(batches[0], feature_names(args.features))
    scoring = Scoring(random_model(args.features, hidden, sample, args), args.batch_size)
    w = Workload("ray_executor")
    w.facts.update(
        {
            "rows": args.rows,
            "features": args.features,
            "hidden": list(hidden),
            "shard_rows": shard_rows,
            "shards": -(-args.rows // shard_rows),
            "batch_size": args.batch_size,
            "device": args.device,
            "precision": args.precision,
            "gpus": gpus,
            "local_threads": threads,
            "driver_wait_seconds": WAIT_SECONDS,
        }
    )
    note = (
        f"{args.rows:,} rows x {args.features} features, MLP {args.features}-"
        f"{'-'.join(map(str, hidden))}-1, {args.device} {args.precision}, "
        f"{w.facts['shards']} shards of {shard_rows:,}"
    )
    equal = True
    with tempfile.TemporaryDirectory(prefix="nightshift-ray-gpu-") as tmp:
        store = DataStore(tmp)
        warm = batches[: max(1, max(counts) * args.batch_size // READ_BATCH)]
        warm_local, _ = run_local(store, "local", WARM, warm, scoring, args.batch_size)
        local, metrics = run_local(store, "local", DAY, batches, scoring, shard_rows)
        w.facts["local"] = {
            "seconds": round(local, 3),
            "warm_up_seconds": round(warm_local, 2),
            "phase_seconds": phases(metrics),
        }
        started = time.perf_counter()
        with ray_session("", num_cpus=max(threads, max(counts)), num_gpus=gpus) as ray:
            w.facts["ray_version"] = ray.__version__
            w.facts["ray_start_seconds"] = round(time.perf_counter() - started, 2)
            for workers in counts:
                seconds, facts = ray_run(
                    ray, store, workers, threads, gpus, scoring, batches, warm, shard_rows
                )
                w.facts[f"ray_{workers}"] = facts
                equal = equal and facts["scores_equal"]
                w.compare(
                    f"ray executor, {workers} worker{'s' * (workers > 1)} "
                    f"({facts['cpus_per_worker']} CPU, "
                    f"{facts['gpus_per_worker']:g} GPU each)",
                    f"local engine ({threads} threads)",
                    args.rows / seconds,
                    args.rows / local,
                    "rows/s",
                    higher_is_better=True,
                    note=f"{note}; outputs {'equal' if facts['scores_equal'] else 'DIFFER'}",
                )
    w.facts["driver_peak_rss_mib"] = round(peak_rss_mb(), 1)
    w.seconds = time.perf_counter() - began
    results = report(w, threads, load)
    print(results.pop("table"))
    if args.out:
        from benchmarks.bench import write_results

        write_results(results, began, args.out)
    return 0 if equal else 1


def ray_run(ray, store, workers, threads, gpus, scoring, batches, warm, shard_rows):
    """One pool of ``workers`` actors: warmed up (each actor starts CUDA and loads its model
    on its first shard), then timed on the partition; its output compared with the local one."""
    cpus, fraction = max(1, threads // workers), gpus / workers if gpus else 0.0
    pool = RayPool(ray, workers, cpus, fraction)
    asset = f"ray{workers}"
    try:
        warm_up, _, _ = run_ray(store, asset, WARM, warm, scoring, scoring.batch_size, pool)
        seconds, figures, metrics = run_ray(store, asset, DAY, batches, scoring, shard_rows, pool)
    finally:
        pool.close()
    worked = sum(v for k, v in metrics.phase_seconds.items() if k != "read")
    facts = {
        "actors": workers,
        "cpus_per_worker": cpus,
        "gpus_per_worker": fraction,
        "seconds": round(seconds, 3),
        "warm_up_seconds": round(warm_up, 2),
        "phase_seconds": phases(metrics),
        # Below the driver's wait between polls (driver_wait_seconds), shards queue behind it.
        "worker_seconds_per_shard": round(worked / max(1, sum(figures.shards.values())), 3),
        **figures.as_dict(),
        **compare(store, asset),
    }
    return seconds, facts


def report(w: Workload, threads: int, load: list[float]) -> dict[str, Any]:
    """The results in benchmarks/bench.py's shape, and its table with the runs' facts below."""
    from benchmarks.bench import markdown

    cuda = torch.cuda.is_available()
    results = {
        "profile": "ray_gpu",
        "environment": {
            "machine": platform.machine(),
            "processor": _cpu_name(),
            "cores_available": len(os.sched_getaffinity(0)),
            "torch_threads": threads,
            "load_average_at_start": load,
            "device": torch.cuda.get_device_name(0) if cuda else "cpu",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "pyarrow": pa.__version__,
            "ray": w.facts.get("ray_version", ""),
        },
        "workloads": [
            {
                "name": w.name,
                "facts": w.facts,
                "comparisons": [c.as_dict() for c in w.comparisons],
                "seconds": round(w.seconds, 1),
            }
        ],
        "seconds": round(w.seconds, 1),
        "finished": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    runs = [f"- {k}: {v}" for k, v in w.facts.items() if isinstance(v, dict)]
    results["table"] = markdown(results) + "\n" + "\n".join(runs) + "\n"
    return results


if __name__ == "__main__":
    sys.exit(main())
