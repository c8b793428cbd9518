"""``fraud_model``: the registered model that tells fraudulent card transactions from genuine
ones, and its one standalone check, its quality before it scores anything."""

from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetExecutionContext,
    Config,
    MaterializeResult,
    MetadataValue,
    asset,
    asset_check,
)
from pydantic import Field

from assets.errors import fail_fast_on_bad_input
from assets.fraud import pipeline
from assets.fraud.schemas import GROUP, MODEL_NAME
from assets.model_asset import champion_data_version, materialized_in_run
from inference.fraud.features import FEATURES
from inference.models.modelstore import ModelNotFoundError, load_model
from inference.models.registry import trained_window
from inference.tabular.tabular import TrainConfig
from policy.automation import GPU_POOL
from resources.inference import InferenceResource
from resources.storage import StorageResource

# A model that ranks fraud this poorly would flood analysts with false alerts or miss most
# fraud; at a ~1% fraud rate a random ranking scores about 0.01.
MIN_VALIDATION_AUPRC = 0.5


class FraudModelConfig(Config):
    retrain: bool = Field(
        default=False, description="Train a challenger even if a champion exists."
    )
    features: list[str] = Field(default=list(FEATURES), description="Feature columns to train on.")
    history_days: int = Field(default=28, description="Most recent labelled days to train on.")
    hidden: list[int] = Field(default=[64, 32], description="Hidden layer widths of the MLP.")
    epochs: int = Field(default=40, description="Most epochs; training stops early on a plateau.")
    batch_size: int = 1024
    learning_rate: float = 2e-3
    validation_fraction: float = 0.2
    seed: int = 0


@asset(group_name=GROUP, kinds={"pytorch"}, pool=GPU_POOL)
def fraud_model(
    context: AssetExecutionContext,
    config: FraudModelConfig,
    storage: StorageResource,
    inference: InferenceResource,
) -> MaterializeResult:
    """The model that tells fraudulent card transactions from genuine ones.

    An MLP over per-transaction features (amount against the account's usual, time of day,
    channel, foreign or rare country, merchants new to the account, bursts of activity), trained
    on the labelled history (confirmed fraud and chargebacks). The champion is reused unless
    `retrain` is set. A retrain leaves out the most recent labelled days the champion did not
    train on and waits as challenger: the promotion gate compares both on those days and
    promotes it only if it is at least as good. The metadata shows the validation AUPRC and
    ROC-AUC, the alert threshold, the training window and the features with their
    normalisation.
    """
    store = storage.store()
    # A current model whose files are damaged fails at once, naming the fix: retraining over
    # it here would replace the champion without anyone deciding to.
    with fail_fast_on_bad_input():
        if not config.retrain:
            try:
                stored = load_model(store.read_bytes, store.models_dir, MODEL_NAME)
            except ModelNotFoundError:
                context.log.info("no fraud model champion: training the first version")
            else:
                context.log.info(
                    f"reusing fraud model champion {stored.version} (set retrain to train a "
                    "challenger)"
                )
                metadata = model_metadata(stored.manifest, stored.version)
                return MaterializeResult(
                    metadata={**metadata, "reused": True},
                    data_version=champion_data_version(store, MODEL_NAME),
                )

    train_config = TrainConfig(
        hidden=tuple(config.hidden),
        epochs=config.epochs,
        batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        validation_fraction=config.validation_fraction,
        seed=config.seed,
    )
    with fail_fast_on_bad_input():
        version, alias, manifest, seconds = pipeline.train_and_save(
            store,
            config.features,
            config.history_days,
            train_config,
            inference.runtime.device,
            context.log.info,
        )
    metadata = model_metadata(manifest, version)
    return MaterializeResult(
        metadata={
            **metadata,
            "reused": False,
            "alias": alias,
            "training_seconds": round(seconds, 2),
        },
        # A challenger waiting for the gate changes nothing downstream (assets/model_asset.py).
        data_version=champion_data_version(store, MODEL_NAME),
    )


@asset_check(asset=MODEL_NAME, blocking=True)
def fraud_model_auprc_above_floor(
    context: AssetCheckExecutionContext, storage: StorageResource
) -> AssetCheckResult:
    """The validation AUPRC of the model this run materialised (a challenger just trained, or
    the champion reused) reaches the floor before it scores or is judged for promotion."""
    store = storage.store()
    version = materialized_in_run(context, MODEL_NAME)
    stored = load_model(store.read_bytes, store.models_dir, MODEL_NAME, version)
    auprc = stored.manifest["metrics"]["val_auprc"]
    return AssetCheckResult(
        passed=auprc >= MIN_VALIDATION_AUPRC,
        metadata={"val_auprc": auprc, "floor": MIN_VALIDATION_AUPRC, "version": stored.version},
    )


def model_metadata(manifest: dict[str, Any], version: str) -> dict[str, Any]:
    """Version, validation metrics, threshold, training data and the feature normalisation."""
    metrics = manifest["metrics"]
    window = trained_window(manifest)
    trained_on = manifest.get("trained_on", {})
    dates = trained_on.get("dates", [])
    rows = metrics["train_rows"] + metrics["val_rows"]
    positives = metrics["train_positives"] + metrics["val_positives"]
    rows_md = zip(manifest["features"], manifest["mean"], manifest["std"], strict=True)
    normalisation = "\n".join(f"| {name} | {mean:.4g} | {std:.4g} |" for name, mean, std in rows_md)
    return {
        "model_version": version,
        "val_auprc": metrics["val_auprc"],
        "val_roc_auc": metrics["val_roc_auc"],
        "val_precision_at_threshold": metrics["val_precision_at_threshold"],
        "val_recall_at_threshold": metrics["val_recall_at_threshold"],
        "threshold": manifest["threshold"],
        "training_rows": rows,
        "fraud_rate": round(positives / rows, 6) if rows else 0.0,
        "training_days": len(dates),
        "training_range": f"{dates[0]} .. {dates[-1]}" if dates else "",
        "trained_through": window[1] if window else "",
        "hidden_layers": MetadataValue.json(manifest["hidden"]),
        "features": MetadataValue.json(manifest["features"]),
        "normalisation": MetadataValue.md(
            "| feature | mean | std |\n|---|---|---|\n" + normalisation
        ),
    }
