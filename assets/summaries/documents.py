"""The day's documents as they land from the content systems: the summaries domain's source."""

import pyarrow as pa
from dagster import AssetExecutionContext, MaterializeResult, asset

from assets.common import landing_result
from orchestration.partitions import backfill_policy, daily_partitions
from resources.storage import StorageResource

DATASET = "documents"

DOCUMENTS_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("published_at", pa.timestamp("us", tz="UTC")),
        ("title", pa.string()),
        ("body", pa.string()),
    ]
)


@asset(
    partitions_def=daily_partitions,
    backfill_policy=backfill_policy,
    group_name="summaries",
    kinds={"parquet"},
)
def documents(context: AssetExecutionContext, storage: StorageResource) -> MaterializeResult:
    """Articles published during the day (news, posts, reports): id, publication time, title
    and body text, as landed by the content systems in ``landing/documents/date=D/``.

    Materialising it checks that the day's files exist and carry the columns the summaries need;
    a missing day or a wrong column fails here, naming the file, before any model runs.
    """
    return landing_result(context, storage.store(), DATASET, DOCUMENTS_SCHEMA)
