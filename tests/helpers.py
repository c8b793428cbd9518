"""Helpers shared by the test modules: the CPU resource map, a run's figures for one asset, and
worlds built once per module and copied by each test."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetKey, DagsterInstance

from assets.day_metadata import day_entries
from resources.inference import InferenceResource
from resources.storage import StorageResource

# Small model calls in full precision: what a test on a CPU can afford and compare exactly.
CPU_INFERENCE = {"device": "cpu", "precision": "fp32", "max_batch_size": 512}


def cpu_inference(**settings: Any) -> InferenceResource:
    """The inference resource on CPU in fp32, batches of 512 rows unless ``settings`` say else."""
    return InferenceResource(**(CPU_INFERENCE | settings))


def cpu_resources(data_root: Path | str, **inference: Any) -> dict[str, Any]:
    """The local resource map over ``data_root``: its storage and :func:`cpu_inference`."""
    return {
        "storage": StorageResource(data_root=str(data_root)),
        "inference": cpu_inference(**inference),
    }


def asset_metadata(result, asset: str | AssetKey, partition: str | None = None) -> dict[str, Any]:
    """Every figure of ``asset``'s materialisation in ``result`` by name, as plain values.

    Args:
        result: what ``materialize`` or ``execute_in_process`` returned.
        asset: the asset's key, or its key as a string.
        partition: which day, where the run materialised several; required then.

    Returns:
        The metadata entries, the ``detail`` table's rows among them (``day_entries``).

    Raises:
        AssertionError: the run did not materialise that asset (or day), materialised one day
            twice, or materialised several days and no ``partition`` says which.
    """
    key = asset if isinstance(asset, AssetKey) else AssetKey.from_user_string(asset)
    events = [
        e
        for e in result.get_asset_materialization_events()
        if e.asset_key == key and (partition is None or e.partition == partition)
    ]
    days = [e.partition for e in events]
    if not events:
        raise AssertionError(f"{key.to_user_string()} {partition or ''} was not materialised")
    if len(events) > 1:
        raise AssertionError(f"{key.to_user_string()} was materialised for {days}: which one?")
    materialization = events[0].event_specific_data.materialization
    return {k: v.value for k, v in day_entries(materialization.metadata).items()}


def trained_and_promoted(result, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A training run that promoted what it trained materialises the model twice: as trained
    (a challenger), then as the champion its gate made it (assets/model_asset.py). Both, in
    that order, by figure name."""
    key = AssetKey.from_user_string(model)
    events = [e for e in result.get_asset_materialization_events() if e.asset_key == key]
    assert len(events) == 2, (
        f"{model}: {len(events)} materialisation(s), expected trained and promoted"
    )
    trained, promoted = (
        {k: v.value for k, v in e.event_specific_data.materialization.metadata.items()}
        for e in events
    )
    assert promoted["alias"] == "champion", promoted
    assert promoted["model_version"] == trained["model_version"], (trained, promoted)
    return trained, promoted


def run_job(job: str, instance, config: dict | None = None, day: str | None = None):
    """A real job of the project's local definitions, run in this process on ``instance``
    (a failure is returned, not raised, so a test can read the failed check)."""
    from orchestration.definitions import build_definitions

    return (
        build_definitions("local")
        .resolve_job_def(job)
        .execute_in_process(
            run_config=config, instance=instance, partition_key=day, raise_on_error=False
        )
    )


@contextmanager
def building_world(base: Path) -> Iterator[DagsterInstance]:
    """A data root (``base/data``) and a Dagster instance (``base/dagster_home``), with the
    environment pointed at them for the block: a module builds its world here once, and each
    test starts from a copy of it (:func:`copy_world`), its own to score, promote or break."""
    home = base / "dagster_home"
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NIGHTSHIFT_DATA_ROOT", str(base / "data"))
        env.setenv("DAGSTER_HOME", str(home))
        with DagsterInstance.get() as instance:
            yield instance


def copy_world(base: Path, data_root: Path, dagster_home: Path) -> None:
    """Copies a world built by :func:`building_world` into a test's ``data_root`` and
    ``dagster_home`` fixtures (the runs, checks and model store with it). Call it before the
    test's ``instance`` is opened: SQLite files copied under an open instance are not read."""
    shutil.copytree(base / "data", data_root, dirs_exist_ok=True)
    shutil.copytree(base / "dagster_home", dagster_home, dirs_exist_ok=True)


def reset_outputs(store) -> None:
    """Forgets every output: the catalog's tables first (they would point at files that are
    gone), then the files under ``outputs/``."""
    from orchestration.outputs_cli import table_names

    for name in table_names(store):
        store.tables.catalog.drop_table(store.tables.identifier(name))
    store.fs.delete_dir_contents(store.path("outputs"), missing_dir_ok=True)
