"""Versioned model storage: safetensors weights plus a JSON manifest, never pickle.

A model lives at ``<models>/<name>/<version>/{model.safetensors,manifest.json}``; the version
is a content hash, and ``<models>/<name>/CURRENT`` names the version in use. Loading never
guesses from file names.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

WriteBytes = Callable[[str, bytes], None]
ReadBytes = Callable[[str], bytes]


@dataclass(frozen=True)
class StoredModel:
    """Weights and manifest of one model version."""

    name: str
    version: str
    tensors: dict[str, torch.Tensor]
    manifest: dict[str, Any]


class ModelNotFoundError(FileNotFoundError):
    """No model of that name has been trained and saved yet (``name`` says which)."""

    def __init__(self, message: str, name: str):
        super().__init__(message)
        self.name = name


def model_version(weights: bytes, manifest: dict[str, Any]) -> str:
    """A short content hash of weights and manifest: same model, same version."""
    digest = hashlib.sha256(weights)
    digest.update(json.dumps(manifest, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def save_model(
    write: WriteBytes, models_dir: str, name: str, tensors: dict[str, torch.Tensor], manifest: dict
) -> str:
    """Saves a model version and makes it current; returns the version.

    Args:
        write: writes bytes to a path atomically (a DataStore's ``write_bytes``).
        models_dir: the folder holding all models.
        name: the model's name, e.g. ``fraud_model``.
        tensors: the state dict to save.
        manifest: JSON-serialisable metadata (features, normalisation, metrics).
    """
    weights = save_safetensors({k: v.detach().contiguous().cpu() for k, v in tensors.items()})
    version = model_version(weights, manifest)
    folder = f"{models_dir}/{name}/{version}"
    full_manifest = {**manifest, "name": name, "version": version}
    write(f"{folder}/model.safetensors", weights)
    write(f"{folder}/manifest.json", json.dumps(full_manifest, indent=2, sort_keys=True).encode())
    # CURRENT is written last, so a reader never sees a version whose files are incomplete.
    write(f"{models_dir}/{name}/CURRENT", version.encode())
    return version


def current_version(read: ReadBytes, models_dir: str, name: str) -> str:
    try:
        return read(f"{models_dir}/{name}/CURRENT").decode().strip()
    except (FileNotFoundError, OSError) as exc:
        raise ModelNotFoundError(
            f"model '{name}' has not been trained: no {models_dir}/{name}/CURRENT", name
        ) from exc


def load_model(
    read: ReadBytes, models_dir: str, name: str, version: str | None = None
) -> StoredModel:
    """Loads a model version (the current one by default) and verifies its hash."""
    version = version or current_version(read, models_dir, name)
    folder = f"{models_dir}/{name}/{version}"
    weights = read(f"{folder}/model.safetensors")
    manifest = json.loads(read(f"{folder}/manifest.json"))
    stripped = {k: v for k, v in manifest.items() if k not in ("name", "version")}
    if model_version(weights, stripped) != version:
        raise ValueError(f"model '{name}' version {version} at {folder} fails its content hash")
    return StoredModel(
        name=name, version=version, tensors=load_safetensors(weights), manifest=manifest
    )
