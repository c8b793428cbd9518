"""Fraud benchmark data: a trained model and landing partitions of a chosen size."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dagster import DagsterInstance, materialize

from assets.fraud.assets import fraud_model
from assets.fraud.demo_data import ROWS_PER_DAY, generate_day
from assets.fraud.schemas import TRANSACTIONS, TRANSACTIONS_LABELLED
from benchmarks.common import QUIET_RUN_CONFIG
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

TRAINING_DAY = "2026-02-27"


def resources(
    root: Path, threads: int, batch_size: int, device: str = "cpu", precision: str = "fp32"
) -> dict[str, Any]:
    """The local resource map pointed at ``root``, on ``device`` with fixed CPU threads."""
    from orchestration.resources import build_resources

    return {
        **build_resources("local"),
        "storage": StorageResource(data_root=str(root)),
        "inference": InferenceResource(
            device=device, precision=precision, cpu_threads=threads, max_batch_size=batch_size
        ),
    }


def train_model(root: Path, threads: int) -> None:
    """Trains the pipeline's fraud model (default architecture) on one small labelled day."""
    store = DataStore(str(root))
    generate_day(store, TRAINING_DAY, scale=0.3)
    config = {"history_days": 1, "epochs": 8}
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [fraud_model],
            resources=resources(root, threads, 4096),
            instance=instance,
            run_config={**QUIET_RUN_CONFIG, "ops": {"fraud_model": {"config": config}}},
        )
    if not result.success:
        raise RuntimeError("training the benchmark's fraud model failed")


def write_partition(root: Path, date: str, rows: int, copies: int = 1) -> int:
    """Writes a transactions landing partition of ``rows`` x ``copies`` rows.

    The generator makes one day of ``rows``; larger partitions repeat it as ``copies`` files
    with distinct transaction ids, which keeps generation fast and memory small. Labels are
    removed, so the partition cannot be mistaken for training history.

    Returns:
        rows written.
    """
    store = DataStore(str(root))
    generate_day(store, date, scale=rows / ROWS_PER_DAY)
    shutil.rmtree(store.landing_path(TRANSACTIONS_LABELLED, date), ignore_errors=True)
    if copies > 1:
        folder = Path(store.landing_path(TRANSACTIONS, date))
        original = folder / "part-00000.parquet"
        table = pq.read_table(original)
        for copy in range(1, copies):
            ids = pc.binary_join_element_wise(f"c{copy}-", table["transaction_id"], "")
            pq.write_table(
                table.set_column(0, "transaction_id", ids), folder / f"part-{copy:05d}.parquet"
            )
        del table
    files = store.landing_files(TRANSACTIONS, date)
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def landing_table(root: Path, date: str) -> pa.Table:
    store = DataStore(str(root))
    from assets.fraud.schemas import TRANSACTIONS_SCHEMA

    return store.read_landing(TRANSACTIONS, date, TRANSACTIONS_SCHEMA)


def split_partition(root: Path, date: str, files: int) -> int:
    """Rewrites a one-file transactions partition as ``files`` files of equal size, in order
    (a landing zone with one file per upstream task). Returns the files written."""
    store = DataStore(str(root))
    (original,) = store.landing_files(TRANSACTIONS, date)
    table = pq.read_table(original)
    Path(original).unlink()
    size = -(-table.num_rows // files)
    for i, start in enumerate(range(0, table.num_rows, size)):
        pq.write_table(table.slice(start, size), f"{Path(original).parent}/part-{i:05d}.parquet")
    return len(store.landing_files(TRANSACTIONS, date))


def landed_day(root: Path, date: str, rows: int, threads: int) -> int:
    """A trained model and a landed day of ``rows`` transactions under ``root``, its landing
    checks passed and its screen saved, as the scoring step finds it; returns the rows."""
    from assets.fraud.assets import transactions

    train_model(root, threads)
    rows = write_partition(root, date, rows)
    with DagsterInstance.ephemeral() as instance:
        if not materialize(
            [transactions],
            partition_key=date,
            resources={"storage": StorageResource(data_root=str(root))},
            instance=instance,
            run_config=QUIET_RUN_CONFIG,
        ).success:
            raise RuntimeError(f"the landing checks failed for {date}")
    return rows
