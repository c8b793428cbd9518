"""The day's documents as they land from the content systems: the summaries domain's source."""

import pyarrow as pa
from dagster import AssetExecutionContext, BackfillPolicy, MaterializeResult, MetadataValue, asset

from assets.common import partition_dates
from assets.common import fail_fast_on_bad_input
from orchestration.partitions import daily_partitions
from resources.storage import StorageResource

DATASET = "documents"

DOCUMENTS_SCHEMA = pa.schema([
    ("doc_id", pa.string()),
    ("published_at", pa.timestamp("us", tz="UTC")),
    ("title", pa.string()),
    ("body", pa.string()),
])


@asset(
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    group_name="summaries",
    kinds={"parquet"},
)
def documents(context: AssetExecutionContext, storage: StorageResource) -> MaterializeResult:
    """Articles published during the day (news, posts, reports): id, publication time, title
    and body text, as landed by the content systems in ``landing/documents/date=D/``.

    Materialising it checks that the day's files exist and carry the columns the summaries need;
    a missing day or a wrong column fails here, naming the file, before any model runs.
    """
    store = storage.store()
    counts = {}
    for date in partition_dates(context):
        with fail_fast_on_bad_input():
            counts[date] = store.count_landing(DATASET, date, DOCUMENTS_SCHEMA)
        where = store.uri(store.landing_path(DATASET, date))
        context.log.info(f"documents {date}: {counts[date]} rows at {where}")
    last = partition_dates(context)[-1]
    return MaterializeResult(
        metadata={
            "dagster/row_count": sum(counts.values()),
            "rows_per_partition": MetadataValue.json(counts),
            "path": MetadataValue.path(store.uri(store.landing_path(DATASET, last))),
        }
    )
