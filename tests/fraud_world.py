"""A data root with a trained fraud model, shared by the test modules that land days beside it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from dagster import DagsterInstance, materialize
from helpers import cpu_resources

from assets.fraud.assets import fraud_model
from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import MODEL_NAME
from inference.models.modelstore import load_model
from resources.storage import DataStore

# Trained worlds of this process by (day, scale), copied to each caller's root: several modules
# train the same day at the same scale, and generate_day writes the same bytes for the same
# date, scale and seed, so a copy holds the data the caller would have generated and a model
# trained on it.
_TRAINED: dict[tuple[str, float], Path] = {}
_CACHE = tempfile.TemporaryDirectory(prefix="fraud_world-")  # removed when the process ends


def trained_fraud_world(root: Path, trained_on: str, scale: float) -> dict:
    """Generates ``trained_on`` (transactions and labels) under ``root`` and trains the model
    (trained once per process for each day and scale, and copied).

    Returns:
        store, root, the local resources (CPU, fp32, batches of 512) and the model's manifest.
    """
    key = (trained_on, scale)
    if key not in _TRAINED:
        pristine = Path(_CACHE.name) / f"{trained_on}-{scale}"
        _train(pristine, trained_on, scale)
        _TRAINED[key] = pristine
    shutil.copytree(_TRAINED[key], root, dirs_exist_ok=True)
    store = DataStore(str(root))
    manifest = load_model(store.read_bytes, store.models_dir, MODEL_NAME).manifest
    return {"store": store, "root": root, "resources": cpu_resources(root), "manifest": manifest}


def _train(root: Path, trained_on: str, scale: float) -> None:
    generate_day(DataStore(str(root)), trained_on, scale=scale)
    with DagsterInstance.ephemeral() as instance:
        assert materialize([fraud_model], resources=cpu_resources(root), instance=instance).success
