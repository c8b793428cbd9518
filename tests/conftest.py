"""Shared fixtures: a temporary data root and Dagster instance for every test that needs one."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import DagsterInstance

from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def data_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv("NIGHTSHIFT_DATA_ROOT", str(root))
    return root


@pytest.fixture
def store(data_root: Path) -> DataStore:
    return DataStore(str(data_root))


@pytest.fixture
def dagster_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture
def instance(dagster_home: Path) -> DagsterInstance:
    with DagsterInstance.get() as inst:
        yield inst


@pytest.fixture
def resources(data_root: Path) -> dict:
    """The local resource map, pointed at the temporary data root, small batches on CPU."""
    return {
        "storage": StorageResource(data_root=str(data_root)),
        "inference": InferenceResource(device="cpu", precision="fp32", max_batch_size=512),
    }
