"""Local model weights load from safetensors only, never unpickled.

Left to itself, ``from_pretrained`` unpickles ``pytorch_model.bin`` from a folder that has no
safetensors, and unpickling a file can run code. So every Hugging Face folder is checked before
it is loaded (:func:`safetensors_folder`), and every load also passes ``use_safetensors=True``;
a torch module's weights are one ``.safetensors`` file (:func:`load_weights`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from torch import nn

M = TypeVar("M", bound="nn.Module")

# Weights written with torch.save (pickle) by older transformers, training scripts or Trainer.
PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


class CheckpointError(ValueError):
    """A local model checkpoint is not configured, missing or unusable; a retry cannot help."""


def safetensors_folder(path: str | Path, auto_class: str = "AutoModel") -> Path:
    """Returns the folder if its weights are safetensors, or raises CheckpointError saying why.

    Args:
        path: a Hugging Face checkpoint folder.
        auto_class: the transformers class that loads it, named in how to convert a folder
            that holds pickled weights only.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"model folder {folder} does not exist")
    if any(f.is_file() for f in folder.glob("*.safetensors")):
        return folder
    pickled = sorted({f.name for p in PICKLED_WEIGHTS for f in folder.glob(p) if f.is_file()})
    if not pickled:
        raise CheckpointError(
            f"model folder {folder} holds no model weights: expected model.safetensors (or "
            "model-*-of-*.safetensors shards) beside config.json"
        )
    convert = (
        f"from transformers import {auto_class} as M; "
        f"M.from_pretrained({str(folder)!r}).save_pretrained({str(folder)!r}, "
        "safe_serialization=True)"
    )
    raise CheckpointError(
        f"model folder {folder} holds pickled weights only ({', '.join(pickled)}) and no "
        "*.safetensors file; weights load from safetensors only, since unpickling a file can run "
        "code. If you trust the checkpoint, convert it once (this unpickles it one last time) "
        f'with python -c "{convert}", then delete {", ".join(pickled)}'
    )


def safetensors_file(path: str | Path | None) -> Path:
    """Returns the weights file if it is safetensors, or raises CheckpointError saying why.

    Args:
        path: a ``.safetensors`` file, e.g. ``safetensors.torch.save_file(model.state_dict(),
            path)``; pickled weights (``.pt``, ``.bin``, ...) are refused with how to convert.
    """
    if not path:
        raise CheckpointError("model_path is not set: give the local path of a .safetensors file")
    file = Path(path)
    if file.is_dir():
        raise CheckpointError(f"model file {file} is a folder, not a .safetensors file")
    if not file.is_file():
        raise CheckpointError(f"model file {file} does not exist")
    if file.suffix == ".safetensors":
        return file
    if any(file.match(p) for p in PICKLED_WEIGHTS):
        target = file.with_suffix(".safetensors")
        convert = (
            "import torch; from safetensors.torch import save_file; "
            f"save_file(torch.load({str(file)!r}, weights_only=True), {str(target)!r})"
        )
        raise CheckpointError(
            f"model file {file} holds pickled weights; weights load from safetensors only, "
            "since unpickling a file can run code. If you trust the file, convert its state "
            f'dict once with python -c "{convert}", then set model_path to {target}'
        )
    raise CheckpointError(f"model file {file} is not a .safetensors file")


def weights_version(path: str | Path | None) -> str:
    """``<file stem>@<content hash>`` of a weights file: it changes exactly when they do."""
    file = safetensors_file(path)
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return f"{file.stem}@{digest.hexdigest()[:12]}"


def load_weights(module: M, path: str | Path | None) -> M:
    """Loads a ``.safetensors`` file into ``module`` (its own architecture, built in code).

    Raises:
        CheckpointError: the file is missing, pickled, unreadable or does not fit the module
            (a retry cannot help, so the step fails at once).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = safetensors_file(path)
    try:
        module.load_state_dict(load_file(file))
    except (SafetensorError, RuntimeError) as exc:
        raise CheckpointError(
            f"model file {file} does not fit {type(module).__name__}: {exc}"
        ) from exc
    return module
