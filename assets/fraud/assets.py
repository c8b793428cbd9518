"""Fraud assets: the day's transactions, the fraud model, each transaction's score, and alerts;
and the model's one standalone check, its quality before it scores anything.

The checks on transactions, scores and alerts are Great Expectations suites evaluated inside
the assets that produce them (see ``assets/fraud/gates.py``). The landing asset, the model and
the scores are declared in their own modules (``landing.py``, ``model.py``, ``scoring.py``);
this one adds the alerts the scores feed.
"""

from dagster import AssetCheckSpec, AssetExecutionContext, AssetSpec, MetadataValue

from assets.days import DayRecorder, daily_assets
from assets.errors import fail_fast_on_bad_input
from assets.fraud import pipeline
from assets.fraud.gates import alert_check_result
from assets.fraud.landing import TRANSACTIONS_LANDING, TransactionsConfig, transactions
from assets.fraud.model import (
    MIN_VALIDATION_AUPRC,
    FraudModelConfig,
    fraud_model,
    fraud_model_auprc_above_floor,
    model_metadata,
)
from assets.fraud.schemas import ALERTS, GROUP, SCORES
from assets.fraud.scoring import fraud_scores
from assets.handed import SNAPSHOTS, handed, read_at, snapshot_metadata
from assets.partitions import partition_dates
from assets.runner import publish_or_reject
from policy.automation import after_parent_passes_checks
from resources.storage import StorageResource

__all__ = [
    "MIN_VALIDATION_AUPRC",
    "TRANSACTIONS_LANDING",
    "FraudModelConfig",
    "TransactionsConfig",
    "fraud_alerts",
    "fraud_model",
    "fraud_model_auprc_above_floor",
    "fraud_scores",
    "model_metadata",
    "transactions",
]


@daily_assets(
    AssetSpec(
        ALERTS,
        deps=[fraud_scores],
        automation_condition=after_parent_passes_checks,
        group_name=GROUP,
        kinds={"parquet"},
        description="The day's flagged transactions for the fraud team to review, highest "
        "score first. Each alert carries the score and model version with the transaction's "
        "account, merchant, amount, currency, time, channel and country.",
    ),
    checks=[AssetCheckSpec("alert_count_matches_flagged_scores", asset=ALERTS, blocking=True)],
)
def fraud_alerts(context: AssetExecutionContext, storage: StorageResource):
    """Publishes each day's alerts from the flagged transactions scored with them, once their
    check passed on the day as staged: a day it refuses never reaches main."""
    store, days = storage.store(), DayRecorder(context)
    for date in partition_dates(context):
        # The scores and flagged details as fraud_scores' materialisation handed them on.
        pins = handed(context, store, [SCORES], date)
        with store.pinned(pins):
            with fail_fast_on_bad_input():
                staged, amount = pipeline.stage_alerts(store, date)
            with store.reading(staged.staged):
                flagged, alerts = pipeline.count_alerts(store, [date])
            scored = store.output_figures(SCORES, date)
        check = alert_check_result(flagged, alerts)
        outcome = publish_or_reject(
            context,
            store,
            ALERTS,
            date,
            staged.staged,
            days.refused([check]),
            {str(check.check_name): bool(check.passed)},
            scored.text("model_version") if scored is not None else "",
        )
        if "main" not in outcome:
            context.log.info(f"fraud_alerts {date}: {staged.rows} alerts -> {staged.uri}")
        metadata = {
            "dagster/row_count": staged.rows,
            "output": MetadataValue.path(staged.uri),
            "flagged_amount": round(amount, 2),
            **{k: v for k, v in outcome.items() if k != SNAPSHOTS},
            **snapshot_metadata(outcome.get(SNAPSHOTS, {})),
            **read_at(pins),
        }
        yield from days.record(ALERTS, date, metadata, [check], why=outcome.get("main"))
    yield from days.finish()
