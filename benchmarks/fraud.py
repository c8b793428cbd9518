"""Workload 1: fraud scoring, parquet in -> parquet out, nightshift against four peers.

Every peer scores the same partition with the same model and the same feature code
(``PartitionProfile``), so the figures compare the ways of feeding the model, not features.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from dagster import DagsterInstance, materialize

from assets.fraud import pipeline
from assets.fraud.assets import fraud_scores
from assets.fraud.schemas import MODEL_NAME, TRANSACTIONS, TRANSACTIONS_SCHEMA
from benchmarks.common import QUIET_RUN_CONFIG, Workload, best_of, timed
from benchmarks.fraud_data import resources, train_model, write_partition
from inference.engine.device import make_runtime
from inference.fraud.features import FEATURE_COLUMNS, PartitionProfile
from inference.models.modelstore import current_version
from inference.tabular.tabular import TabularScorer
from resources.storage import DataStore

DAY = "2026-03-01"


def run_nightshift(
    root: Path,
    date: str,
    threads: int,
    batch_size: int,
    device: str = "cpu",
    instance: DagsterInstance | None = None,
) -> float:
    """Materialises ``fraud_scores`` for one day through Dagster; returns wall seconds.

    On a fresh instance (the default) the step first lands and checks ``transactions``
    itself, as a scoring asset materialised alone does (``land_for_scoring`` in
    assets/landing.py); on an instance where that day was landed already, the step scores it
    alone, as in the job."""
    with contextlib.ExitStack() as stack:
        if instance is None:
            instance = stack.enter_context(DagsterInstance.ephemeral())
        result, seconds = timed(
            lambda: materialize(
                [fraud_scores],
                partition_key=date,
                resources=resources(root, threads, batch_size, device, _precision(device)),
                instance=instance,
                run_config=QUIET_RUN_CONFIG,
            )
        )
    if not result.success:
        raise RuntimeError(f"fraud_scores failed for {date}")
    return seconds


def _precision(device: str) -> str:
    return "fp32" if device == "cpu" else "auto"


def load_scorer(root: Path, device: str = "cpu") -> tuple[TabularScorer, str]:
    store = DataStore(str(root))
    version = current_version(store.read_bytes, store.models_dir, MODEL_NAME)
    runtime = make_runtime(device, _precision(device))
    return pipeline.load_scorer(store, version, runtime), version


def forward(scorer: TabularScorer, x: torch.Tensor, batch_size: int) -> np.ndarray:
    """The model alone over a standardised tensor already in memory, in batches."""
    out = []
    runtime = scorer.runtime
    with torch.inference_mode():
        for start in range(0, len(x), batch_size):
            batch = x[start : start + batch_size].to(runtime.device, non_blocking=True)
            logits = scorer.model(batch.to(runtime.dtype)).squeeze(1)
            out.append(torch.sigmoid(logits.float()))
    return torch.cat(out).cpu().numpy()


def run_pandas(root: Path, date: str, scorer: TabularScorer, version: str, out: Path) -> float:
    """What a user writes by hand: whole file into pandas, one tensor, batched forward, to_parquet."""
    store = DataStore(str(root))
    began = time.perf_counter()
    frame = pd.concat(pd.read_parquet(f) for f in store.landing_files(TRANSACTIONS, date))
    table = pa.Table.from_pandas(frame[FEATURE_COLUMNS], preserve_index=False)
    batch = table.combine_chunks().to_batches()[0]
    profile = PartitionProfile.build([batch])
    x = torch.from_numpy(scorer.standardizer.transform(profile.features(batch, scorer.features)))
    scores = forward(scorer, x, 65_536)
    pd.DataFrame(
        {
            "transaction_id": frame["transaction_id"].to_numpy(),
            "score": scores,
            "flagged": scores >= np.float32(scorer.threshold),
            "model_version": version,
        }
    ).to_parquet(out, index=False)
    return time.perf_counter() - began


def _shape(scorer: TabularScorer) -> str:
    widths = [m.in_features for m in scorer.model if isinstance(m, torch.nn.Linear)]
    return "-".join(map(str, [*widths, 1]))


def row_at_a_time(batch: pa.RecordBatch, profile: PartitionProfile, scorer: TabularScorer) -> float:
    """One row per model call, features included; returns rows per second."""
    began = time.perf_counter()
    for i in range(batch.num_rows):
        scorer.score(profile.features(batch.slice(i, 1), scorer.features))
    return batch.num_rows / (time.perf_counter() - began)


async def _micro_batched(
    batch: pa.RecordBatch, profile: PartitionProfile, scorer: TabularScorer, size: int, wait: float
) -> np.ndarray:
    """The tutorial micro-batcher: callers queue one row each and await a future; a worker
    sleeps until ``size`` rows are queued or the oldest has waited ``wait`` seconds."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def worker() -> None:
        while True:
            first = await queue.get()
            if first is None:
                return
            items, oldest = [first], loop.time()
            while len(items) < size:
                while len(items) < size and not queue.empty():
                    items.append(queue.get_nowait())
                if len(items) >= size or loop.time() - oldest >= wait:
                    break
                await asyncio.sleep(0.001)
            stop = items[-1] is None
            items = [i for i in items if i is not None]
            rows = pa.array([i for i, _ in items])
            scores = scorer.score(profile.features(batch.take(rows), scorer.features))
            for (_, future), score in zip(items, scores, strict=True):
                future.set_result(float(score))
            if stop:
                return

    async def predict(row: int) -> float:
        future = loop.create_future()
        await queue.put((row, future))
        return await future

    task = asyncio.create_task(worker())
    scores = await asyncio.gather(*(predict(i) for i in range(batch.num_rows)))
    await queue.put(None)
    await task
    return np.asarray(scores, dtype=np.float32)


def micro_batcher(
    batch: pa.RecordBatch, profile: PartitionProfile, scorer: TabularScorer
) -> tuple[np.ndarray, float]:
    """Runs the asyncio micro-batcher (batch 32, max wait 10 ms); returns (scores, rows/s)."""
    scores, seconds = timed(lambda: asyncio.run(_micro_batched(batch, profile, scorer, 32, 0.010)))
    return scores, batch.num_rows / seconds


def run(
    work: Path,
    rows: int,
    threads: int,
    batch_size: int,
    samples: dict[str, int],
    device: str = "cpu",
) -> Workload:
    w = Workload("1 fraud scoring")
    root = work / "fraud"
    train_model(root, threads)
    rows = write_partition(root, DAY, rows)
    scorer, version = load_scorer(root, device)
    store = DataStore(str(root))
    w.facts.update(rows=rows, batch_size=batch_size, model=str(scorer.model).replace("\n", " "))

    # Nightshift end to end: the real asset, read -> features -> model -> parquet, published,
    # its output checks included. The warm-up (imports, page cache) also lands and checks the
    # day's transactions in the instance the timed runs share, so they time the scoring step
    # as the job runs it, after its landing step; the peers land nothing either.
    with DagsterInstance.ephemeral() as instance:
        run_nightshift(root, DAY, threads, batch_size, device, instance)
        seconds = min(
            run_nightshift(root, DAY, threads, batch_size, device, instance) for _ in range(2)
        )
    ours = rows / seconds

    # Peers that work from memory get the partition and its features up front, untimed.
    table = store.read_landing(TRANSACTIONS, DAY, TRANSACTIONS_SCHEMA)
    batch = table.combine_chunks().to_batches()[0]
    profile = PartitionProfile.build([batch])
    features = profile.features(batch, scorer.features)
    x = torch.from_numpy(scorer.standardizer.transform(features)).to(scorer.runtime.device)
    _, pure = best_of(lambda: forward(scorer, x, batch_size), 3)

    def in_memory() -> None:
        prof = PartitionProfile.build([batch])
        forward(
            scorer,
            torch.from_numpy(scorer.standardizer.transform(prof.features(batch, scorer.features))),
            batch_size,
        )

    _, floor = best_of(in_memory, 2)
    pandas_seconds = min(
        run_pandas(root, DAY, scorer, version, work / "pandas.parquet") for _ in range(2)
    )
    head = batch.slice(0, samples["row"])
    row_rate = row_at_a_time(head, profile, scorer)
    micro = batch.slice(0, samples["micro"])
    micro_scores, micro_rate = micro_batcher(micro, profile, scorer)
    expected = scorer.score(features[: samples["micro"]])
    w.facts["micro_batcher_matches_batched_scores"] = bool(
        np.allclose(micro_scores, expected, atol=1e-5)
    )

    # The target is against features + forward pass over data already in memory: what is left
    # is the I/O that streaming should hide. The forward pass alone has no target: for this MLP
    # it is a tenth of the work, so no way of feeding the model could reach it.
    w.compare(
        "nightshift end to end",
        "features + forward pass, all in memory (no I/O)",
        ours,
        rows / floor,
        "rows/s",
        True,
        0.8,
        "how much of the parquet I/O, the checks and Dagster's own cost is hidden",
    )
    w.compare(
        "nightshift end to end",
        "pure forward pass, tensors in memory",
        ours,
        rows / pure,
        "rows/s",
        True,
        None,
        f"no target (retired): the shipped model is a {_shape(scorer)} MLP whose forward pass "
        f"is {pure / seconds:.0%} of nightshift's time",
    )
    w.compare(
        "nightshift end to end",
        "hand-written pandas (whole file, one tensor)",
        ours,
        rows / pandas_seconds,
        "rows/s",
        True,
        1.0,
        "memory: see workload 5",
    )
    w.compare(
        "nightshift end to end",
        f"row at a time ({samples['row']:,} rows)",
        ours,
        row_rate,
        "rows/s",
        True,
        30.0,
    )
    w.compare(
        "nightshift end to end",
        f"asyncio micro-batcher, 32 rows / 10 ms ({samples['micro']:,} rows)",
        ours,
        micro_rate,
        "rows/s",
        True,
        None,
    )
    w.facts.update(
        nightshift_seconds=round(seconds, 3),
        pure_forward_seconds=round(pure, 4),
        in_memory_seconds=round(floor, 3),
        pandas_seconds=round(pandas_seconds, 3),
    )
    return w
