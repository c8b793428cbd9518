"""Blocking checks on the summaries domain's outputs: every document covered, nothing blank.

Each check looks at the partitions of the run it belongs to; a failure stops the digest (or
anything else downstream) from reading a day that is incomplete.
"""

import pyarrow as pa
import pyarrow.compute as pc
from dagster import AssetCheckExecutionContext, AssetCheckResult, MetadataValue, asset_check

from assets.summaries.digest import ASSET as DIGEST
from assets.summaries.digest import daily_digest
from assets.summaries.document_summaries import ASSET as SUMMARIES
from assets.summaries.document_summaries import document_summaries
from assets.summaries.documents import DATASET, DOCUMENTS_SCHEMA, documents
from resources.storage import DataStore, StorageResource


def _dates(context: AssetCheckExecutionContext) -> list[str]:
    if not (context.has_partition_key or context.has_partition_key_range):
        raise ValueError(
            f"{context.check_specs[0].key.name} checks daily partitions: run it with the asset's "
            "partition (or range), not on its own"
        )
    return list(context.partition_keys)


@asset_check(asset=documents, blocking=True)
def document_ids_unique(
    context: AssetCheckExecutionContext, storage: StorageResource
) -> AssetCheckResult:
    """Every document of a day has its own doc_id, so each summary maps back to one document."""
    store = storage.store()
    duplicates = {}
    for date in _dates(context):
        ids = _landed_ids(store, date)
        extra = len(ids) - len(pc.unique(ids))
        if extra or ids.null_count:
            duplicates[date] = {"duplicates": extra, "nulls": ids.null_count}
    return _result(duplicates)


@asset_check(asset=document_summaries, blocking=True)
def summaries_cover_every_document(
    context: AssetCheckExecutionContext, storage: StorageResource
) -> AssetCheckResult:
    """One summary per landed document: same doc_ids, no document lost or repeated."""
    store = storage.store()
    problems = {}
    for date in _dates(context):
        landed = _landed_ids(store, date)
        summarised = store.read_output(SUMMARIES, date).column("doc_id")
        missing = len(set(landed.to_pylist()) - set(summarised.to_pylist()))
        if len(summarised) != len(landed) or missing:
            problems[date] = {
                "documents": len(landed),
                "summaries": len(summarised),
                "missing": missing,
            }
    return _result(problems)


@asset_check(asset=document_summaries, blocking=True)
def summaries_not_blank(
    context: AssetCheckExecutionContext, storage: StorageResource
) -> AssetCheckResult:
    """No document is left with an empty summary or without the model_version that wrote it."""
    store = storage.store()
    blank = {}
    for date in _dates(context):
        table = store.read_output(SUMMARIES, date)
        count = 0
        for column in ("summary", "model_version"):
            values = table.column(column)
            empty = pc.sum(pc.equal(pc.utf8_trim_whitespace(values), "")).as_py()
            count += values.null_count + (empty or 0)
        if count:
            blank[date] = count
    return _result(blank)


@asset_check(asset=daily_digest, blocking=True)
def digest_covers_every_document(
    context: AssetCheckExecutionContext, storage: StorageResource
) -> AssetCheckResult:
    """Each summarised document sits in exactly one topic, and doc_count matches doc_ids."""
    store = storage.store()
    problems = {}
    for date in _dates(context):
        summarised = store.read_output(SUMMARIES, date).column("doc_id").to_pylist()
        digest = store.read_output(DIGEST, date)
        in_topics = [d for ids in digest.column("doc_ids").to_pylist() for d in ids]
        counts_match = digest.column("doc_count").to_pylist() == [
            len(ids) for ids in digest.column("doc_ids").to_pylist()
        ]
        if sorted(in_topics) != sorted(summarised) or not counts_match:
            problems[date] = {
                "documents": len(summarised),
                "in_topics": len(in_topics),
                "distinct_in_topics": len(set(in_topics)),
                "doc_count_matches": counts_match,
            }
    return _result(problems)


def _landed_ids(store: DataStore, date: str) -> pa.ChunkedArray:
    return store.read_landing(DATASET, date, DOCUMENTS_SCHEMA, columns=["doc_id"]).column("doc_id")


def _result(problems: dict) -> AssetCheckResult:
    """Passes when no partition has a problem; the problems, by date, go into the metadata."""
    metadata = {"problems": MetadataValue.json(problems)}
    return AssetCheckResult(passed=not problems, metadata=metadata)
