"""A data root with a trained fraud model, shared by the test modules that land days beside it."""

from __future__ import annotations

from pathlib import Path

from dagster import DagsterInstance, materialize
from helpers import cpu_resources

from assets.fraud.assets import fraud_model
from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import MODEL_NAME
from inference.models.modelstore import load_model
from resources.storage import DataStore


def trained_fraud_world(root: Path, trained_on: str, scale: float) -> dict:
    """Generates ``trained_on`` (transactions and labels) under ``root`` and trains the model.

    Returns:
        store, root, the local resources (CPU, fp32, batches of 512) and the model's manifest.
    """
    store = DataStore(str(root))
    generate_day(store, trained_on, scale=scale)
    resources = cpu_resources(root)
    with DagsterInstance.ephemeral() as instance:
        assert materialize([fraud_model], resources=resources, instance=instance).success
    manifest = load_model(store.read_bytes, store.models_dir, MODEL_NAME).manifest
    return {"store": store, "root": root, "resources": resources, "manifest": manifest}
