"""A real Iceberg REST catalog server on loopback: Lakana's (``lakana-server`` from PyPI, in its
own environment, ``.venv-rest-catalog``, made by ``make install``), on a SQLite store in a
temporary folder.

Lakana behaves as managed REST catalogs do: a token on every call, tables only under its
top-level namespaces (``bronze``, ``silver``, ``gold``), and table locations it assigns itself
(a location given with a new table is refused), under its environment's storage root.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aws_world import stop_process_group, wait_for
from ui_stack import free_port

from resources.storage import REPO_ROOT

REST_ENV = REPO_ROOT / ".venv-rest-catalog" / "bin"
# The server's bootstrap token: fixed by the two LAKANA_BOOTSTRAP_PAT_* settings below.
KEY_ID, SECRET = "nightshift", "nightshift-test-secret-0123456789"
TOKEN = f"lakana_pat_{KEY_ID}_{SECRET}"
# Lakana's name for a catalog (its "environment"): the REST path prefix a client is given.
PREFIX = "dev"
NAMESPACE = "gold.nightshift"


@dataclass(frozen=True)
class RestCatalog:
    uri: str
    # Where the server puts its tables' files (a local folder, like the data roots of tests).
    warehouse: Path

    def client_env(self) -> dict[str, str]:
        """pyiceberg's own configuration of the catalog named ``nightshift``: what a user sets
        for a REST catalog beside NIGHTSHIFT_CATALOG=rest and its URI."""
        return {
            "PYICEBERG_CATALOG__NIGHTSHIFT__TOKEN": TOKEN,
            "PYICEBERG_CATALOG__NIGHTSHIFT__PREFIX": PREFIX,
        }

    def settings(self) -> dict[str, str]:
        return {"catalog": "rest", "catalog_uri": self.uri, "catalog_namespace": NAMESPACE}


@pytest.fixture(scope="module")
def rest_catalog(tmp_path_factory) -> Iterator[RestCatalog]:
    """``lakana-server`` on a free loopback port, with one catalog whose tables live under a
    folder of this module's temporary files."""
    binary = REST_ENV / "lakana-server"
    if not binary.exists():
        pytest.fail(f"no REST catalog server at {binary}: `make install` creates it")
    root = tmp_path_factory.mktemp("rest-catalog")
    port = free_port()
    env = {
        **os.environ,
        "LAKANA_DATABASE__URL": f"sqlite:///{root / 'lakana.db'}",
        "LAKANA_HOST": "127.0.0.1",
        "LAKANA_PORT": str(port),
        "LAKANA_BOOTSTRAP_PAT_KEY_ID": KEY_ID,
        "LAKANA_BOOTSTRAP_PAT_SECRET": SECRET,
        "LAKANA_LOG__LEVEL": "WARNING",
    }
    migrated = subprocess.run(
        [binary, "migrate"], env=env, capture_output=True, text=True, timeout=120
    )
    assert migrated.returncode == 0, f"lakana-server migrate failed: {migrated.stderr[-3000:]}"
    log = root / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [binary], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    uri = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            assert server.poll() is None, f"lakana-server exited: {log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{uri}/healthz", timeout=2) as answer:
                    return answer.status == 200
            except OSError:
                return False

        wait_for(healthy, 60, "the REST catalog server to answer", log)
        warehouse = root / "warehouse"
        warehouse.mkdir()
        body = {"name": PREFIX, "storage": {"scheme": "file", "root": warehouse.as_uri()}}
        request = urllib.request.Request(
            f"{uri}/api/v1/environments",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status in (200, 201), answer.read()
        yield RestCatalog(uri, warehouse)
    finally:
        stop_process_group(server, timeout=20)


@pytest.fixture
def rest_client(rest_catalog: RestCatalog, monkeypatch) -> RestCatalog:
    """This process configured for the REST catalog as a user's would be. pyiceberg reads its
    environment once, at import, so it is read again here; a process started with it set (a
    run, the CLI, the writers a test spawns) sees it at once."""
    from pyiceberg.utils.config import Config

    for key, value in rest_catalog.client_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("pyiceberg.catalog._ENV_CONFIG", Config())
    return rest_catalog
