"""The standalone check on the fraud domain: the model's quality before it scores anything.

The checks on transactions, scores and alerts are Great Expectations suites evaluated inside
the assets that produce them (see ``assets/fraud/gates.py``).
"""

from dagster import AssetCheckResult, asset_check

from assets.fraud.schemas import MODEL_NAME
from inference.models.modelstore import load_model
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
