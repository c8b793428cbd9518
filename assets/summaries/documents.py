"""The day's documents as they land from the content systems: the summaries domain's source."""

from dagster import AssetExecutionContext, AssetSpec
from pydantic import Field

from assets.common import fail_fast_on_bad_input, landing_day, partition_dates, record_landing_read
from assets.runner import DayRecorder, daily_assets
from assets.summaries.gates import DOCUMENT_SUITES, documents_check_results
from assets.summaries.quality import screen_documents
from assets.summaries.schemas import DATASET, DOCUMENTS_SCHEMA
from resources.quality import QualityConfig, preload_great_expectations, quarantine_limit
from resources.storage import StorageResource

__all__ = ["DATASET", "DOCUMENTS_SCHEMA", "documents"]


class DocumentsConfig(QualityConfig):
    deadline_hours: float = Field(
        default=5.0,
        description="Hours after its UTC day ends by which a day's documents should have "
        "landed (the summaries schedule runs at 05:00).",
    )


@daily_assets(
    AssetSpec(DATASET, group_name="summaries", kinds={"parquet"}),
    checks=[suite.spec() for suite in DOCUMENT_SUITES.values()],
)
def documents(context: AssetExecutionContext, config: DocumentsConfig, storage: StorageResource):
    """Articles published during the day (news, posts, reports): id, publication time, title
    and body text, as landed by the content systems in ``landing/documents/date=D/``.

    Materialising it checks that the day's files exist and carry the columns the summaries need,
    and screens every document (id present and unique, UTF-8 text that is not empty and not too
    long, published inside the day, landed on time); a missing day, a wrong column or too many
    unusable documents fails here, naming the file or the reasons, before any model runs.
    """
    preload_great_expectations()
    store, days = storage.store(), DayRecorder(context)
    record_landing_read(context, store, DATASET, partition_dates(context))
    for date in partition_dates(context):
        landed = landing_day(context, store, DATASET, DOCUMENTS_SCHEMA, date)
        with fail_fast_on_bad_input():
            screen = screen_documents(store, date, config.check_sample_rows, config.check_seed)
        checks = documents_check_results(
            store,
            {date: screen},
            max_quarantine_rate=quarantine_limit(config.max_quarantine_rate),
            deadline_hours=config.deadline_hours,
            sample_rows=config.check_sample_rows,
            seed=config.check_seed,
        )
        metadata = {**landed, "rows_to_quarantine": screen.plan.count}
        yield from days.record(DATASET, date, metadata, checks)
    yield from days.finish()
