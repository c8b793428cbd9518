"""What the data-quality gates cost on a large fraud partition, against scoring it.

The gates on ``fraud_scores`` are: applying the landing checks' quarantine plan in the feature
pre-pass, the exact statistics and the seeded row sample kept while every batch streams through
the model, and the Great Expectations suites run after the commit over those statistics and
that sample.
Each is timed on its own, on the same partition the asset scores end to end, so the share is
"extra seconds the gates add" over "seconds the asset takes". The landing checks of the
``transactions`` asset (a separate step in the job: the screening pass, quarantine plan and
duplicate ids over the whole partition, and their suites) and the one-off import of
great_expectations are reported beside it; both shares together are the checks' cost. Both
assets' suites are also timed alone, and again with every expectation validated by GE (none of
the statistics answered from the exact figures, ``resources.quality.validation.plainly_passes``).

    python -m benchmarks.quality --rows 1000000 --threads 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pyarrow as pa
from dagster import AssetKey, DagsterInstance, materialize

from assets.day_metadata import day_figures
from assets.fraud import pipeline
from assets.fraud.assets import fraud_scores
from assets.fraud.gates import score_check_results, transactions_check_results
from assets.fraud.quality import load_screen, save_screen, screen_transactions
from assets.fraud.schemas import MODEL_NAME, SCORES, TRANSACTIONS, TRANSACTIONS_SCHEMA
from assets.partitions import PartitionReport
from benchmarks.common import QUIET_RUN_CONFIG, best_of, set_threads
from benchmarks.fraud_data import resources, train_model, write_partition
from inference.engine.invariants import StreamStats
from inference.engine.metrics import BatchMetrics
from inference.engine.output_partition import ShardReport
from inference.fraud.score_figures import score_observer
from inference.fraud.screening import TransactionScreen
from inference.models.modelstore import current_version
from resources.quality import DEFAULT_SAMPLE_ROWS, conservation_figures, sample_output, validation
from resources.storage import DataStore, Published

DAY = "2026-03-01"


def _score_once(root: Path, threads: int, batch_size: int) -> tuple[float, dict[str, Any]]:
    """Materialises ``fraud_scores`` for the day; returns wall seconds and its metadata."""
    with DagsterInstance.ephemeral() as instance:
        started = time.perf_counter()
        result = materialize(
            [fraud_scores],
            partition_key=DAY,
            resources=resources(root, threads, batch_size),
            instance=instance,
            run_config=QUIET_RUN_CONFIG,
        )
        seconds = time.perf_counter() - started
    if not result.success:
        raise RuntimeError("fraud_scores failed")
    (event,) = [
        e for e in result.get_asset_materialization_events() if e.asset_key == AssetKey(SCORES)
    ]
    metadata = event.event_specific_data.materialization.metadata
    return seconds, day_figures(metadata)


def _observe_seconds(store: DataStore, threshold: float, version: str, batch_size: int) -> float:
    """The streaming statistics alone, over the published scores in model-call batches."""
    scored = store.read_output(SCORES, DAY)
    observe = score_observer(threshold, version)
    batches = scored.to_batches(max_chunksize=batch_size)
    stats = StreamStats()
    started = time.perf_counter()
    for batch in batches:
        observe(batch.select(["transaction_id"]), pa.Table.from_batches([batch]), stats)
    return time.perf_counter() - started


def _ge_import_seconds() -> float:
    """great_expectations' import in a fresh process that already has dagster and torch."""
    code = (
        "import time, dagster, pandas, torch; t = time.perf_counter(); "
        "import great_expectations; print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def measure(
    root: Path, rows: int, threads: int, batch_size: int, repeats: int = 2
) -> dict[str, Any]:
    """Times the gates on a ``rows``-row fraud partition against scoring it end to end; the
    suites alone are the best of ``repeats``."""
    set_threads(threads)
    if not (root / "models").exists():
        train_model(root, threads)
    store = DataStore(str(root))
    if not store.exists(store.landing_path(TRANSACTIONS, DAY)):
        write_partition(root, DAY, rows)
    rows = store.count_landing(TRANSACTIONS, DAY, TRANSACTIONS_SCHEMA)

    # As in the job, the transactions step's landing checks run first and leave their plan.
    save_screen(store, DAY, screen_transactions(store, DAY))
    _score_once(root, threads, batch_size)  # warm-up: imports (GE included), page cache
    runs = [_score_once(root, threads, batch_size) for _ in range(2)]
    scoring, metadata = min(runs, key=lambda r: r[0])

    version = current_version(store.read_bytes, store.models_dir, MODEL_NAME)
    threshold = float(metadata["threshold"])
    # The scoring step's pre-pass builds the feature profile the model needs anyway, reusing the
    # landing checks' plan; its extra cost is the time over a bare profile pass.
    _, screen = best_of(
        lambda: screen_transactions(
            store, DAY, build_profile=True, plan=load_screen(store, DAY)
        ).profile(),
        2,
    )
    _, profile = best_of(lambda: pipeline.profile(store, TRANSACTIONS, DAY, TRANSACTIONS_SCHEMA), 2)
    observe = min(_observe_seconds(store, threshold, version, batch_size) for _ in range(2))

    committed = store.output_figures(SCORES, DAY)
    shards = ShardReport(
        rows_in=committed.value("rows_in"),
        rows_out=committed.value("rows"),
        rows_scored=committed.value("rows_scored"),
        rows_quarantined=committed.value("rows_quarantined"),
        stats=StreamStats.from_json(committed.value("stats")),
    )
    # The run takes the output sample while the scores stream (resumed attempts read it back).
    sample = sample_output(store, SCORES, DAY, DEFAULT_SAMPLE_ROWS, 0)
    report = PartitionReport(
        DAY, BatchMetrics(), Published("", shards.rows_out, 1), shards, sample=sample
    )
    reference = pipeline.score_reference(store, version)

    def score_suites() -> None:
        # The engine's row conservation figures, which the runner hands the suites, included:
        # the gates cost what they did when the suites counted them themselves.
        landed = store.count_landing(TRANSACTIONS, DAY, TRANSACTIONS_SCHEMA)
        rows = conservation_figures(store, SCORES, DAY, shards, landed)
        score_check_results(
            store, [replace(report, conservation=rows)], version=version, threshold=threshold,
            reference=reference, sample_rows=DEFAULT_SAMPLE_ROWS, seed=0,
        )  # fmt: skip

    screened = screen_transactions(store, DAY, sample_rows=DEFAULT_SAMPLE_ROWS, seed=0)

    def landing_suites(found: TransactionScreen) -> None:
        transactions_check_results(
            store, {DAY: found}, max_quarantine_rate=0.01, deadline_hours=2.0,
            sample_rows=DEFAULT_SAMPLE_ROWS, seed=0,
        )  # fmt: skip

    _, suites = best_of(score_suites, repeats)
    _, transactions_suites = best_of(lambda: landing_suites(screened), repeats)
    with patch.object(validation, "plainly_passes", lambda *_: False):
        _, suites_through_ge = best_of(score_suites, repeats)
        _, transactions_suites_through_ge = best_of(lambda: landing_suites(screened), repeats)

    def landing() -> None:
        found = screen_transactions(store, DAY, sample_rows=DEFAULT_SAMPLE_ROWS, seed=0)
        save_screen(store, DAY, found)
        landing_suites(found)

    _, landing_seconds = best_of(landing, 2)
    gates = max(screen - profile, 0.0) + observe + suites
    return {
        "rows": rows,
        "threads": threads,
        "batch_size": batch_size,
        "scoring_seconds": round(scoring, 3),
        "screening_extra_seconds": round(max(screen - profile, 0.0), 3),
        "streaming_statistics_seconds": round(observe, 3),
        "suites_seconds": round(suites, 3),
        "suites_seconds_in_run": metadata.get("check_seconds"),
        "suites_seconds_all_through_ge": round(suites_through_ge, 3),
        "transactions_suites_seconds": round(transactions_suites, 3),
        "transactions_suites_seconds_all_through_ge": round(transactions_suites_through_ge, 3),
        "gates_seconds": round(gates, 3),
        "gates_share_of_scoring": round(gates / scoring, 4),
        "gates_share_of_scoring_without_gates": round(gates / max(scoring - gates, 1e-9), 4),
        "landing_checks_seconds": round(landing_seconds, 3),
        "landing_checks_share_of_scoring": round(landing_seconds / scoring, 4),
        "ge_import_seconds_once_per_process": round(_ge_import_seconds(), 3),
        "sample_rows": DEFAULT_SAMPLE_ROWS,
        "sample_seed": 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=65_536)
    parser.add_argument("--work", type=Path, default=Path(".nightshift/bench/quality"))
    parser.add_argument("--repeats", type=int, default=2, help="best of this many suite runs")
    args = parser.parse_args()
    figures = measure(args.work, args.rows, args.threads, args.batch_size, args.repeats)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
