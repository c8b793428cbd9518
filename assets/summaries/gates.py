"""The summaries domain's quality gate: Great Expectations suites
(``suites/document_summaries.json``) over exact figures from the summariser as every document
streamed through it, plus a seeded sample of rows (the documents' own gate is
``assets/documents/gates.py``). The assets that produce the data evaluate them, so a
failing ERROR check stops the digest (or anything else downstream) in the same run.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from dagster import AssetCheckResult, MetadataValue

from assets.partitions import PartitionReport
from assets.summaries.schemas import SUMMARIES
from inference.text.segment import LengthCap
from resources.quality import SuiteRun, load_suites, sample_output
from resources.storage import DataStore

SUMMARY_SUITES = load_suites(Path(__file__).parent / "suites" / "document_summaries.json")
# Counted per summary while streaming; the suite reads them by these names.
SUMMARY_COUNTS = (
    "summary_blank",
    "summary_longer_than_document",
    "summary_not_drawn_from_document",
    "summary_over_length_cap",
    "model_version_missing",
    "ids_not_passed_through",
    "doc_id_null",
)


def summary_check_results(
    store: DataStore,
    reports: list[PartitionReport],
    *,
    version: str,
    extractive: bool,
    cap: LengthCap,
    sample_rows: int,
    seed: int,
) -> list[AssetCheckResult]:
    """The `document_summaries` suites over each day's exact statistics and published sample.

    Abstractive summaries may paraphrase, so "drawn from the document" is a lexical grounding
    test there and only warns.
    """
    run = SuiteRun(SUMMARY_SUITES)
    for report in reports:
        shards = report.shards
        assert shards is not None, "document_summaries is always written by the sharded engine"
        figures = {
            **report.conservation,
            **{name: shards.stats.counts.get(name, 0) for name in SUMMARY_COUNTS},
            "summary_sentences_max": int(shards.stats.maxima.get("summary_sentences", 0)),
        }
        sample = sample_output(store, SUMMARIES, report.date, sample_rows, seed)
        parameters = {"model_versions": [version], "max_summary_sentences": cap.max_sentences}
        run.add(report.date, figures, sample, parameters)
    shared = {
        "sample_rows": sample_rows,
        "sample_seed": seed,
        "extractive": extractive,
        "length_cap": MetadataValue.json(asdict(cap)),
    }
    return run.results(shared, warn=() if extractive else ("summaries_drawn_from_documents",))
