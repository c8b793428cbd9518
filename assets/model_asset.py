"""What a model asset tells Dagster: its data version is its champion.

Every scoring run materialises its model asset (reusing the champion), and a retrain
materialises it with a challenger that may never be promoted. Were each of those a new data
version, every day scored before it would read "Unsynced" in the UI although the same champion
scored it; a badge that is always on hides the one that matters. So the model asset's data
version is the champion's version: reusing it, or training a challenger that waits, changes
nothing downstream; a promotion does, and is recorded as a materialisation of the model asset
(:func:`champion_materialization`), wherever it happens (the gate in a training run, the
promotion job, ``nightshift promote``), so the model's page shows the champion too.
"""

from __future__ import annotations

from dagster import AssetCheckExecutionContext, AssetKey, AssetMaterialization, DataVersion

from assets.dagster_private import (
    CODE_VERSION_TAG,
    DATA_VERSION_IS_USER_PROVIDED_TAG,
    DATA_VERSION_TAG,
)
from inference.models.registry import CHAMPION, AliasChange, champion_version
from resources.storage import DataStore


def champion_data_version(store: DataStore, model: str) -> DataVersion | None:
    """The model asset's data version: its champion's version (None before the first)."""
    version = champion_version(store.read_bytes, store.models_dir, model)
    return DataVersion(version) if version else None


def champion_materialization(model: str, change: AliasChange, run_id: str) -> AssetMaterialization:
    """The model asset's materialisation for a promotion made in run ``run_id``: the new
    champion's version as its data version (the days its predecessor scored then read as
    unsynced), and who promoted it and why in its metadata."""
    assert change.alias == CHAMPION and change.version, change
    return AssetMaterialization(
        asset_key=model,
        description=f"{change.version} promoted to {CHAMPION} by {change.by}",
        metadata={
            "model_version": change.version,
            "alias": CHAMPION,
            "promoted_by": change.by,
            "promoted_at": change.at,
            "forced": change.forced,
            "reason": change.reason,
        },
        # What Dagster records for an asset's own ``data_version`` (the code version, as it
        # writes it for an asset without one, makes the version read as the asset's own),
        # which a materialisation logged by another op cannot pass otherwise.
        tags={
            CODE_VERSION_TAG: run_id,
            DATA_VERSION_TAG: change.version,
            DATA_VERSION_IS_USER_PROVIDED_TAG: "true",
        },
    )


def materialized_in_run(context: AssetCheckExecutionContext, model: str) -> str | None:
    """The model version this run's materialisation of the model asset recorded (a challenger
    just trained, or the champion reused), or None when this run made none."""
    event = context.instance.get_latest_materialization_event(AssetKey(model))
    run_id = context.op_execution_context.run_id
    if event is None or event.run_id != run_id or event.asset_materialization is None:
        return None
    version = event.asset_materialization.metadata.get("model_version")
    return None if version is None else str(version.value)
