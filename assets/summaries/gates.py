"""The summaries domain's quality gates: Great Expectations suites (``suites/*.json``) over
exact figures from the screening pass and from the summariser as every document streamed
through it, plus a seeded sample of rows. The assets that produce the data evaluate them, so a
failing ERROR check stops the digest (or anything else downstream) in the same run.
"""

from __future__ import annotations

from pathlib import Path

from dataclasses import asdict

from dagster import AssetCheckResult, MetadataValue

from assets.common import PartitionReport
from assets.gates import conservation_figures, landing_check_results
from assets.summaries.quality import QUARANTINED_REASONS, DocumentScreen
from assets.summaries.schemas import DATASET, DOCUMENTS_SCHEMA, SUMMARIES
from inference.segment import LengthCap
from resources.quality import Evidence, check_result, load_suites, sample_output, validate
from resources.storage import DataStore

SUITES = Path(__file__).parent / "suites"
DOCUMENT_SUITES = load_suites(SUITES / "documents.json")
SUMMARY_SUITES = load_suites(SUITES / "document_summaries.json")
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


def documents_check_results(
    store: DataStore,
    screens: dict[str, DocumentScreen],
    *,
    max_quarantine_rate: float,
    deadline_hours: float,
    sample_rows: int,
    seed: int,
) -> list[AssetCheckResult]:
    """The `documents` suites over each day's screening figures and a sample of documents."""
    return landing_check_results(
        DOCUMENT_SUITES,
        store,
        DATASET,
        screens,
        QUARANTINED_REASONS,
        max_quarantine_rate=max_quarantine_rate,
        deadline_hours=deadline_hours,
        sample_rows=sample_rows,
        seed=seed,
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
    evidence: dict[str, list[Evidence]] = {name: [] for name in SUMMARY_SUITES}
    for report in reports:
        shards = report.shards
        assert shards is not None, "document_summaries is always written by the sharded engine"
        landed = store.count_landing(DATASET, report.date, DOCUMENTS_SCHEMA)
        figures = {
            **conservation_figures(store, SUMMARIES, report.date, shards, landed),
            **{name: shards.stats.counts.get(name, 0) for name in SUMMARY_COUNTS},
            "summary_sentences_max": int(shards.stats.maxima.get("summary_sentences", 0)),
        }
        sample = sample_output(store, SUMMARIES, report.date, sample_rows, seed)
        found = validate(
            list(SUMMARY_SUITES.values()),
            report.date,
            figures,
            sample,
            {"model_versions": [version], "max_summary_sentences": cap.max_sentences},
        )
        for name, e in found.items():
            evidence[name].append(e)
    shared = {
        "sample_rows": sample_rows,
        "sample_seed": seed,
        "extractive": extractive,
        "length_cap": MetadataValue.json(asdict(cap)),
    }
    return [
        check_result(
            suite,
            evidence[name],
            shared,
            severity="WARN"
            if name == "summaries_drawn_from_documents" and not extractive
            else None,
        )
        for name, suite in SUMMARY_SUITES.items()
    ]
