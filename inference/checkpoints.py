"""Local Hugging Face checkpoint folders: weights load from safetensors only, never unpickled.

Left to itself, ``from_pretrained`` unpickles ``pytorch_model.bin`` from a folder that has no
safetensors, and unpickling a file can run code. So every folder is checked before it is
loaded, and every load also passes ``use_safetensors=True``.
"""

from __future__ import annotations

from pathlib import Path

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
