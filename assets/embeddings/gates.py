"""The embeddings domain's quality gates: the Great Expectations suites of
``suites/document_embeddings.json`` over exact figures kept as every vector streamed out of the
encoder (:func:`embedding_observer`), the engine's row counts, and a seeded sample of rows.

Nothing is read back to check the vectors: dimension, finiteness and norm are counted per batch
as it is written, so the figures cover every row. The asset evaluates them itself, so a failing
ERROR check fails the day's step and blocks anything downstream of it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from dagster import AssetCheckResult

from assets.embeddings.schemas import DIMENSION, EMBEDDINGS
from assets.partitions import PartitionReport
from inference.engine.invariants import StreamStats
from resources.quality import QualityConfig, SuiteRun, load_suites, sample_output
from resources.storage import DataStore

EMBEDDING_SUITES = load_suites(Path(__file__).parent / "suites" / "document_embeddings.json")
# How far a vector's L2 norm may be from 1. Normalised float32 vectors are within ~1e-7; 1e-3
# still ranks a dot product as the cosine would.
NORM_TOLERANCE = 1e-3
# Counted per output batch; the suites read them by these names.
EMBEDDING_COUNTS = (
    "embedding_null",
    "embedding_wrong_dimension",
    "embedding_not_finite",
    "embedding_norm_off_unit",
    "model_version_missing",
    "ids_not_passed_through",
    "doc_id_null",
)
# The sample's columns: the row-level expectations need no vectors.
SAMPLE_COLUMNS = ["doc_id", "model_version"]


def embedding_observer(version: str, dimension: int = DIMENSION, tolerance: float = NORM_TOLERANCE):
    """Exact statistics of ``document_embeddings`` batches against the documents they embed:
    vectors missing, of another dimension, not finite or off unit norm; rows without the model
    version; ids that are not the input's, in order."""

    def observe(scored: pa.RecordBatch, out: pa.Table, stats: StreamStats) -> None:
        column = out["embedding"].combine_chunks()
        width = column.type.list_size
        present = len(column) - column.null_count
        vectors = column.flatten().to_numpy(zero_copy_only=False).reshape(present, width)
        stats.count("embedding_null", column.null_count)
        stats.count("embedding_wrong_dimension", 0 if width == dimension else present)
        if present:
            stats.extremes("embedding_dimension", np.array([width]))
        finite = np.isfinite(vectors).all(axis=1)
        stats.count("embedding_not_finite", int((~finite).sum()))
        norm_error = np.abs(np.linalg.norm(vectors[finite].astype(np.float64), axis=1) - 1.0)
        stats.count("embedding_norm_off_unit", int((norm_error > tolerance).sum()))
        stats.extremes("embedding_norm_error", norm_error)
        wrong = pc.fill_null(pc.not_equal(out["model_version"], version), True)
        stats.count("model_version_missing", int(pc.sum(wrong).as_py() or 0))
        same = out["doc_id"].equals(pa.chunked_array([scored["doc_id"]]))
        stats.count("ids_not_passed_through", 0 if same else out.num_rows)
        stats.count("doc_id_null", out["doc_id"].null_count)

    return observe


def embedding_check_results(
    store: DataStore, report: PartitionReport, version: str, config: QualityConfig
) -> list[AssetCheckResult]:
    """The `document_embeddings` suites over one day's exact statistics and row sample."""
    shards = report.shards
    assert shards is not None, "document_embeddings is always written by the sharded engine"
    stats, date = shards.stats, report.date
    sample_rows, seed = config.check_sample_rows, config.check_seed
    figures = {
        **report.conservation,
        **{name: stats.counts.get(name, 0) for name in EMBEDDING_COUNTS},
        # A day with no vectors has none of another dimension.
        "embedding_dimension": int(stats.maxima.get("embedding_dimension", DIMENSION)),
        "embedding_norm_error_max": stats.maxima.get("embedding_norm_error", 0.0),
    }
    sample = report.sample
    if sample is None:  # a resumed attempt did not see every row stream past
        sample = sample_output(store, EMBEDDINGS, date, sample_rows, seed, SAMPLE_COLUMNS)
    limits = {"model_dimension": DIMENSION, "norm_tolerance": NORM_TOLERANCE}
    run = SuiteRun(EMBEDDING_SUITES)
    run.add(date, figures, sample, {"model_versions": [version], **limits})
    return run.results({"sample_rows": sample_rows, "sample_seed": seed, **limits})
