"""Versioned model storage: safetensors weights plus a JSON manifest, never pickle.

A model lives at ``<models>/<name>/<version>/{model.safetensors,manifest.json}``; the version
is a content hash, and ``<models>/<name>/CURRENT`` names the champion, the version that scores
(``inference/models/registry.py`` moves it, and the challenger beside it). Loading never guesses from
file names.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


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


class ModelUnusableError(ValueError):
    """A model version exists but cannot be loaded: a file of its folder is missing, or its
    bytes no longer match the version's content hash (truncated, edited, half copied). A retry
    reads the same bytes, so only retraining or restoring the folder mends it.

    Attributes:
        name: the model's name.
        folder: the version's folder, where the files should be.
    """

    def __init__(self, message: str, name: str, folder: str):
        super().__init__(message)
        self.name, self.folder = name, folder


def model_version(weights: bytes, manifest: dict[str, Any]) -> str:
    """A short content hash of weights and manifest: same model, same version."""
    digest = hashlib.sha256(weights)
    digest.update(json.dumps(manifest, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def save_model(
    write: WriteBytes, models_dir: str, name: str, tensors: dict[str, torch.Tensor], manifest: dict
) -> str:
    """Saves a model version's files and returns the version; it moves no alias (a new version
    becomes challenger or champion through ``inference.models.registry.register``).

    Args:
        write: writes bytes to a path atomically (a DataStore's ``write_bytes``).
        models_dir: the folder holding all models.
        name: the model's name, e.g. ``fraud_model``.
        tensors: the state dict to save.
        manifest: JSON-serialisable metadata (features, normalisation, metrics).
    """
    from safetensors.torch import save as save_safetensors

    weights = save_safetensors({k: v.detach().contiguous().cpu() for k, v in tensors.items()})
    version = model_version(weights, manifest)
    folder = f"{models_dir}/{name}/{version}"
    full_manifest = {**manifest, "name": name, "version": version}
    write(f"{folder}/model.safetensors", weights)
    write(f"{folder}/manifest.json", json.dumps(full_manifest, indent=2, sort_keys=True).encode())
    return version


def current_version(read: ReadBytes, models_dir: str, name: str) -> str:
    """The champion's version, as ``CURRENT`` names it (``registry.champion_version``)."""
    try:
        return read(f"{models_dir}/{name}/CURRENT").decode().strip()
    except (FileNotFoundError, OSError) as exc:
        raise ModelNotFoundError(
            f"model '{name}' has not been trained: no {models_dir}/{name}/CURRENT", name
        ) from exc


def load_model(
    read: ReadBytes, models_dir: str, name: str, version: str | None = None
) -> StoredModel:
    """Loads a model version (the champion by default) and verifies its hash.

    Raises:
        ModelNotFoundError: the model has no champion (none was trained).
        ModelUnusableError: the version's files are missing, unreadable as a model, or fail
            its content hash.
    """
    from safetensors.torch import load as load_safetensors

    version = version or current_version(read, models_dir, name)
    folder = f"{models_dir}/{name}/{version}"
    weights = _read_file(read, name, folder, "model.safetensors")
    raw = _read_file(read, name, folder, "manifest.json")
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise ModelUnusableError(
            f"model '{name}' version {version}: {folder}/manifest.json is not JSON ({exc})",
            name,
            folder,
        ) from exc
    stripped = {k: v for k, v in manifest.items() if k not in ("name", "version")}
    if model_version(weights, stripped) != version:
        raise ModelUnusableError(
            f"model '{name}' version {version} at {folder} fails its content hash: "
            f"model.safetensors ({len(weights):,} bytes) or manifest.json is not what was saved",
            name,
            folder,
        )
    return StoredModel(
        name=name, version=version, tensors=load_safetensors(weights), manifest=manifest
    )


def _read_file(read: ReadBytes, name: str, folder: str, file: str) -> bytes:
    """One file of a model version; a missing one makes the version unusable (CURRENT names
    it, so it was saved whole once: it was deleted or never fully copied)."""
    try:
        return read(f"{folder}/{file}")
    except FileNotFoundError as exc:
        raise ModelUnusableError(
            f"model '{name}' version {folder.rsplit('/', 1)[-1]}: {folder}/{file} is missing",
            name,
            folder,
        ) from exc
