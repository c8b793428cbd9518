"""The optional MLflow model registry mirror: every version registered and every alias moved on
the model store is registered and moved on an MLflow tracking server too.

Set ``NIGHTSHIFT_MLFLOW_TRACKING_URI`` (``http://mlflow:5000``) to turn it on. The store stays
the truth scoring reads; MLflow shows the same names, versions and aliases
(``models:/fraud_model@champion``) to the tools that speak it. It talks to the server's REST
API, so the pipelines need no ``mlflow`` package, whose pins (pyarrow among them) would
otherwise constrain the whole stack.

MLflow numbers versions 1, 2, 3...; each carries the store's content-hash version as the tag
``nightshift.version``, and its ``source`` is the version's folder in the store
(``nightshift-store:///<models>/<name>/<version>``).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

TRACKING_ENV = "NIGHTSHIFT_MLFLOW_TRACKING_URI"
VERSION_TAG = "nightshift.version"
# MLflow refuses a local path as a version's source unless it lies in a run's artifacts, and
# the store's folder is not one: the scheme says where it is without MLflow reading it.
STORE_SCHEME = "nightshift-store"


class MlflowRegistryError(RuntimeError):
    """The MLflow server refused a call or could not be reached (the message says which)."""


@dataclass(frozen=True)
class MlflowRegistry:
    """One MLflow tracking server's model registry, through its REST API."""

    uri: str
    timeout_s: float = 30.0

    def register_version(self, name: str, version: str, source: str, description: str) -> str:
        """Registers the store's ``version`` of ``name`` once (``source``: its folder in the
        store); returns MLflow's version number."""
        self._ensure_model(name)
        existing = self.version_number(name, version)
        if existing is not None:
            return existing
        body = {
            "name": name,
            "source": f"{STORE_SCHEME}:///{source.lstrip('/')}",
            "description": description,
            "tags": [{"key": VERSION_TAG, "value": version}],
        }
        return str(self._call("POST", "model-versions/create", body)["model_version"]["version"])

    def version_number(self, name: str, version: str) -> str | None:
        """MLflow's number for the store's ``version``, or None when it is not registered."""
        query = {"filter": f"name='{name}' and tag.`{VERSION_TAG}`='{version}'"}
        found = self._call("GET", "model-versions/search", params=query).get("model_versions", [])
        return str(found[0]["version"]) if found else None

    def set_alias(self, name: str, alias: str, version: str, tags: dict[str, str]) -> None:
        """Points ``alias`` at the store's ``version`` and tags that version with ``tags``."""
        number = self.version_number(name, version)
        if number is None:
            raise MlflowRegistryError(
                f"{self.uri}: {name} version {version} was never registered in MLflow"
            )
        body = {"name": name, "alias": alias, "version": number}
        self._call("POST", "registered-models/alias", body)
        for key, value in tags.items():
            body = {"name": name, "version": number, "key": key, "value": value}
            self._call("POST", "model-versions/set-tag", body)

    def delete_alias(self, name: str, alias: str) -> None:
        self._call("DELETE", "registered-models/alias", {"name": name, "alias": alias})

    def aliases(self, name: str) -> dict[str, str]:
        """Alias -> MLflow version number, as the server holds them."""
        model = self._call("GET", "registered-models/get", params={"name": name})
        return {a["alias"]: str(a["version"]) for a in model["registered_model"].get("aliases", [])}

    def _ensure_model(self, name: str) -> None:
        try:
            self._call("POST", "registered-models/create", {"name": name})
        except MlflowRegistryError as exc:
            if "RESOURCE_ALREADY_EXISTS" not in str(exc):
                raise

    def _call(
        self, method: str, endpoint: str, body: dict | None = None, params: dict | None = None
    ) -> dict[str, Any]:
        url = f"{self.uri.rstrip('/')}/api/2.0/mlflow/{endpoint}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            url, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise MlflowRegistryError(f"MLflow {method} {url}: HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise MlflowRegistryError(
                f"MLflow tracking server {self.uri} ({TRACKING_ENV}) unreachable: {exc}"
            ) from exc
        return json.loads(raw) if raw else {}


def from_env() -> MlflowRegistry | None:
    """The mirror ``NIGHTSHIFT_MLFLOW_TRACKING_URI`` names, read at each call; None when unset."""
    uri = os.environ.get(TRACKING_ENV, "").strip()
    return MlflowRegistry(uri) if uri else None
