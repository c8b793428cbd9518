"""The packaged sentence encoder as the digest and the evaluation load it, once per process
through the inference resource (the summaries' and the embeddings' predictors load their own
models where their shards run)."""

from __future__ import annotations

from inference.text.encoder import SentenceEncoder, encoder_version, load_sentence_encoder
from resources.inference import InferenceResource


def encoder_key() -> str:
    return f"sentence_encoder:{encoder_version()}"


def sentence_encoder(inference: InferenceResource) -> SentenceEncoder:
    """The packaged all-MiniLM-L6-v2, loaded on first use in this process."""
    return inference.model(encoder_key(), load_sentence_encoder)
