"""The MLflow mirror against a real MLflow tracking server (SQLite store) started here: the
versions and aliases the fraud jobs make, as MLflow's own client reads them back."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance
from helpers import asset_metadata, trained_and_promoted

from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import MODEL_NAME
from inference.models.mlflow_registry import TRACKING_ENV, VERSION_TAG
from inference.models.registry import champion_version, promote
from orchestration.definitions import build_definitions
from resources.storage import REPO_ROOT, DataStore

# `make install` puts MLflow in its own environment: its pins (pyarrow) conflict with ours, and
# nightshift only speaks its REST API.
MLFLOW_ENV = REPO_ROOT / ".venv-mlflow" / "bin"
HISTORY = [f"2026-03-{d:02d}" for d in range(1, 11)]
NEW_DAYS = ["2026-03-11", "2026-03-12"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """``mlflow server`` on a SQLite store, on a free loopback port, for this test only."""
    binary = MLFLOW_ENV / "mlflow"
    if not binary.exists():
        pytest.fail(f"no MLflow server at {binary}: `make install` creates it")
    port = _free_port()
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = [binary, "server", "--backend-store-uri", store, "--host", "127.0.0.1"]
    command += ["--port", str(port), "--workers", "1"]
    command += ["--default-artifact-root", str(tmp_path / "artifacts")]
    log = (tmp_path / "mlflow.log").open("w")
    # Its own process group: the server starts job workers that must stop with it.
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(uri, server, tmp_path / "mlflow.log")
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()


def _wait_healthy(uri: str, server: subprocess.Popen, log: Path, limit_s: float = 180) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow server exited {server.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"mlflow server not healthy after {limit_s}s: {log.read_text()[-2000:]}")


def _as_mlflow_shows(uri: str) -> dict:
    """The registered model as MLflow's Python client reads it, from MLflow's environment."""
    script = (
        "import json, sys; from mlflow import MlflowClient; c = MlflowClient(sys.argv[1]); "
        f"m = c.get_registered_model('{MODEL_NAME}'); "
        f"vs = c.search_model_versions(\"name='{MODEL_NAME}'\"); "
        "print(json.dumps({'aliases': m.aliases, 'versions': {v.version: v.tags for v in vs}, "
        f"'champion': c.get_model_version_by_alias('{MODEL_NAME}', 'champion').version}}))"
    )
    out = subprocess.run(
        [MLFLOW_ENV / "python", "-c", script, uri], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _retrain(instance: DagsterInstance, **settings):
    config = {"ops": {MODEL_NAME: {"config": {"retrain": True, **settings}}}}
    job = build_definitions("local").resolve_job_def("fraud_training_job")
    return job.execute_in_process(run_config=config, instance=instance, raise_on_error=False)


def test_versions_and_aliases_show_in_mlflow(
    data_root: Path, instance, mlflow_server: str, monkeypatch
) -> None:
    monkeypatch.setenv(TRACKING_ENV, mlflow_server)
    store = DataStore(str(data_root))
    for day in HISTORY:
        generate_day(store, day, scale=0.02)
    first = asset_metadata(_retrain(instance, history_days=1), MODEL_NAME)["model_version"]
    for day in NEW_DAYS:
        generate_day(store, day, scale=0.02)

    promoted = _retrain(instance)

    assert promoted.success
    second = trained_and_promoted(promoted, MODEL_NAME)[0]["model_version"]
    shown = _as_mlflow_shows(mlflow_server)
    assert {n: tags[VERSION_TAG] for n, tags in shown["versions"].items()} == {
        "1": first,
        "2": second,
    }
    # The challenger alias was removed when it was promoted, as on the store.
    assert shown["aliases"] == {"champion": "2"} and shown["champion"] == "2"
    assert shown["versions"]["2"]["nightshift.champion_by"] == f"run {promoted.run_id}"
    assert shown["versions"]["2"]["nightshift.champion_forced"] == "false"

    reason = "rolled back while the new features are checked"
    promote(store.read_bytes, store.write_bytes, store.models_dir, MODEL_NAME, first, "ana",
            reason, forced=True)  # fmt: skip

    shown = _as_mlflow_shows(mlflow_server)
    assert shown["aliases"] == {"champion": "1"}
    assert champion_version(store.read_bytes, store.models_dir, MODEL_NAME) == first
    tags = shown["versions"]["1"]
    assert (tags["nightshift.champion_by"], tags["nightshift.champion_reason"]) == ("ana", reason)
    assert tags["nightshift.champion_forced"] == "true"
