"""Blocking checks on the fraud model and on what the scoring assets published."""

from dagster import AssetCheckResult, asset_check

from assets.fraud.pipeline import ScoresSummary
from assets.fraud.schemas import MODEL_NAME
from inference.modelstore import load_model
from resources.storage import StorageResource

# A model that ranks fraud this poorly would flood analysts with false alerts or miss most
# fraud; at a ~1% fraud rate a random ranking scores about 0.01.
MIN_VALIDATION_AUPRC = 0.5


@asset_check(asset=MODEL_NAME, blocking=True)
def fraud_model_auprc_above_floor(storage: StorageResource) -> AssetCheckResult:
    """The current fraud model's validation AUPRC reaches the floor before it scores anything."""
    store = storage.store()
    stored = load_model(store.read_bytes, store.models_dir, MODEL_NAME)
    auprc = stored.manifest["metrics"]["val_auprc"]
    return AssetCheckResult(
        passed=auprc >= MIN_VALIDATION_AUPRC,
        metadata={"val_auprc": auprc, "floor": MIN_VALIDATION_AUPRC, "version": stored.version},
    )


def score_check_results(summary: ScoresSummary) -> list[AssetCheckResult]:
    """`scores_in_unit_interval` and `row_count_matches_input`, from the published partitions."""
    in_range = summary.nulls == 0 and 0.0 <= summary.min_score and summary.max_score <= 1.0
    return [
        AssetCheckResult(
            check_name="scores_in_unit_interval",
            passed=in_range,
            metadata={
                "min_score": summary.min_score,
                "max_score": summary.max_score,
                "nulls": summary.nulls,
            },
        ),
        AssetCheckResult(
            check_name="row_count_matches_input",
            passed=summary.rows_in == summary.rows_out,
            metadata={"rows_in": summary.rows_in, "rows_out": summary.rows_out},
        ),
    ]


def alert_check_result(flagged: int, alerts: int) -> AssetCheckResult:
    """`alert_count_matches_flagged_scores`: every flagged score became exactly one alert."""
    return AssetCheckResult(
        check_name="alert_count_matches_flagged_scores",
        passed=flagged == alerts,
        metadata={"flagged_scores": flagged, "alerts": alerts},
    )
