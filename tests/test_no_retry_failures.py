"""Failures no retry can mend (a broken model, a storage layout) fail once, naming path and fix."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance
from fraud_world import trained_fraud_world

from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import MODEL_NAME
from orchestration.definitions import build_definitions
from policy.retries import ERROR_RETRY_POLICY

DAY = "2026-04-02"
JOB = "fraud_scoring_job"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A data root with a trained fraud model and one landed day, copied by each test."""
    root = tmp_path_factory.mktemp("no_retry") / "data"
    world = trained_fraud_world(root, "2026-04-01", 0.02)
    generate_day(world["store"], DAY, scale=0.02)
    return root


@pytest.fixture
def root(pristine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "data"
    shutil.copytree(pristine, root)
    monkeypatch.setenv("NIGHTSHIFT_DATA_ROOT", str(root))
    return root


def _model_folder(root: Path) -> Path:
    models = root / "models" / MODEL_NAME
    return models / (models / "CURRENT").read_text().strip()


def _run_job(tmp_path: Path, only: str | None = None):
    """The real job, with the project's retry policy on every step (``only``: one asset of it,
    as when it is materialised from its page)."""
    job = build_definitions("local").resolve_job_def(JOB)
    selection = [AssetKey(only)] if only else None
    with DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(
            partition_key=DAY, instance=instance, raise_on_error=False, asset_selection=selection
        )
        return result, instance.all_logs(result.run_id)


def _failed_once(result, logs, step: str) -> str:
    """Asserts the step failed on its first attempt without a retry; returns its message."""
    assert not result.success
    assert ERROR_RETRY_POLICY.max_retries > 0  # the policy would have retried it
    started = [e for e in logs if e.dagster_event and e.dagster_event.step_key == step]
    kinds = [e.dagster_event.event_type for e in started]
    assert kinds.count(DagsterEventType.STEP_START) == 1
    assert DagsterEventType.STEP_UP_FOR_RETRY not in kinds
    [failure] = [e for e in result.get_step_failure_events() if e.step_key == step]
    error = failure.step_failure_data.error
    assert error.cls_name == "Failure"
    return error.message


def test_a_deleted_manifest_fails_once_naming_the_folder_and_the_fix(root, tmp_path) -> None:
    folder = _model_folder(root)
    (folder / "manifest.json").unlink()
    message = _failed_once(*_run_job(tmp_path), "fraud_model")
    assert f"{folder}/manifest.json is missing" in message
    assert "retrain with `fraud_training_job`" in message
    assert f"restore the model folder {folder}" in message


def test_scoring_alone_with_a_deleted_manifest_fails_once_naming_the_fix(root, tmp_path) -> None:
    folder = _model_folder(root)
    (folder / "manifest.json").unlink()
    message = _failed_once(*_run_job(tmp_path, only="fraud_scores"), "fraud_scores")
    assert f"{folder}/manifest.json is missing" in message
    assert "retrain with `fraud_training_job`" in message


def test_a_truncated_model_fails_once_naming_the_folder_and_the_fix(root, tmp_path) -> None:
    folder = _model_folder(root)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    message = _failed_once(*_run_job(tmp_path), "fraud_model")
    assert f"at {folder} fails its content hash" in message
    assert "retrain with `fraud_training_job`" in message
    assert f"restore the model folder {folder}" in message


def test_an_output_path_that_is_a_file_fails_once_naming_it(root, tmp_path) -> None:
    blocker = root / "outputs" / "fraud_scores"
    blocker.parent.mkdir(exist_ok=True)
    blocker.write_text("not a folder")
    message = _failed_once(*_run_job(tmp_path), "fraud_scores")
    assert f"{blocker} is a file where nightshift keeps a folder" in message
    assert "move that file away or delete it" in message


@pytest.fixture
def immutable(root: Path) -> Iterator[Path]:
    """The outputs folder made immutable (``chattr +i``), or unwritable for a non-root user."""
    outputs = root / "outputs"
    outputs.mkdir(exist_ok=True)
    made = subprocess.run(["chattr", "+i", str(outputs)], capture_output=True).returncode == 0
    if not made and os.geteuid() != 0:
        outputs.chmod(0o555)
    elif not made:
        pytest.skip("neither chattr +i nor a non-root chmod can make a folder unwritable here")
    yield outputs
    if made:
        subprocess.run(["chattr", "-i", str(outputs)], check=True)
    outputs.chmod(0o755)


def test_an_immutable_outputs_folder_fails_once_naming_it(immutable, tmp_path) -> None:
    result, logs = _run_job(tmp_path)
    [step] = {e.step_key for e in result.get_step_failure_events()}
    message = _failed_once(result, logs, step)
    assert f"may not write to {immutable}" in message
    assert f"chmod -R u+w {immutable}" in message and "chattr -R -i" in message
