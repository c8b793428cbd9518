"""``daily_digest``: the day's topics, each with its documents, keywords and a short summary."""

import time

import pyarrow as pa
from dagster import AssetExecutionContext, AssetSpec, Config, MetadataValue
from pydantic import Field

from assets.days import DayRecorder, daily_assets
from assets.handed import handed, read_at, snapshot_metadata
from assets.partitions import PartitionReport, log_partition, partition_dates
from assets.runner import scoring_metadata
from assets.summaries.document_summaries import ASSET as SUMMARIES
from assets.summaries.document_summaries import document_summaries
from assets.text_models import encoder_key, sentence_encoder
from inference.engine.metrics import BatchMetrics
from inference.text.topics import Topic, build_digest
from policy.automation import GPU_POOL, after_parent_passes_checks
from resources.inference import InferenceResource
from resources.storage import StorageResource

ASSET = "daily_digest"

DIGEST_SCHEMA = pa.schema(
    [
        ("topic_id", pa.int32()),
        ("label", pa.string()),
        ("doc_count", pa.int64()),
        ("doc_ids", pa.list_(pa.string())),
        ("summary", pa.string()),
    ]
)


class DigestConfig(Config):
    max_topics: int = Field(
        default=12,
        description="Most topics a day is split into; the number "
        "used is the one in 2..max_topics whose clusters separate best.",
    )
    summary_sentences: int = Field(default=3, description="Sentences in each topic's summary.")
    keywords: int = Field(default=3, description="Keywords in each topic's label.")


@daily_assets(
    AssetSpec(
        ASSET,
        deps=[document_summaries],
        automation_condition=after_parent_passes_checks,
        group_name="summaries",
        kinds={"pytorch", "parquet"},
        description="The topics of the day for the morning briefing: documents grouped by "
        "subject, one row per topic with a keyword label, its document count and ids, and a "
        "short summary drawn from the most representative sentences of its documents' "
        "summaries. Largest topic first.",
    ),
    pool=GPU_POOL,
)
def daily_digest(
    context: AssetExecutionContext,
    config: DigestConfig,
    storage: StorageResource,
    inference: InferenceResource,
):
    """Groups each day's summaries into topics and publishes them."""
    store, days = storage.store(), DayRecorder(context)
    encoder = sentence_encoder(inference)
    dates = partition_dates(context)
    for date in dates:
        metrics = BatchMetrics()
        pins = handed(context, store, [SUMMARIES], date)
        with store.pinned(pins):  # the summaries as their materialisation handed them on
            day = store.read_output(SUMMARIES, date).select(["doc_id", "summary"])
        started = time.perf_counter()
        topics, embedded = build_digest(
            encoder,
            day.column("doc_id").to_pylist(),
            day.column("summary").to_pylist(),
            max_batch_tokens=inference.batch_tokens,
            max_batch_size=inference.max_batch_size,
            k_max=config.max_topics,
            summary_sentences=config.summary_sentences,
            keywords=config.keywords,
        )
        metrics.record_batch(day.num_rows, len(topics), time.perf_counter() - started)
        published = store.publish(ASSET, date, [_table(topics)], DIGEST_SCHEMA)
        report = PartitionReport(date, metrics.finish(), published)
        log_partition(context, ASSET, report)
        metadata = scoring_metadata(
            report,
            model_version=encoder.version,
            device=inference.runtime.describe(),
            model_loads=inference.load_count(encoder_key()),
        )
        labels = [f"{t.label} ({len(t.doc_ids)})" for t in topics]
        metadata.update(partitions=len(dates), topics=MetadataValue.json(labels))
        metadata.update(snapshot_metadata(published.snapshots), **read_at(pins))
        yield from days.record(ASSET, date, metadata)
    yield from days.finish()


def _table(topics: list[Topic]) -> pa.Table:
    return pa.table(
        {
            "topic_id": [t.topic_id for t in topics],
            "label": [t.label for t in topics],
            "doc_count": [len(t.doc_ids) for t in topics],
            "doc_ids": [t.doc_ids for t in topics],
            "summary": [t.summary for t in topics],
        },
        schema=DIGEST_SCHEMA,
    )
