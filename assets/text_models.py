"""The packaged sentence encoder as the digest and the evaluation load it, once per process
through the inference resource, and the figures of the text models' calls (the summaries' and
the embeddings' predictors load their own models where their shards run)."""

from __future__ import annotations

from dataclasses import dataclass

from inference.engine.metrics import BatchMetrics
from inference.text.encoder import SentenceEncoder, encoder_version, load_sentence_encoder
from resources.inference import InferenceResource


@dataclass
class ModelMetrics(BatchMetrics):
    """Batch metrics plus the model calls (length buckets) behind them."""

    model_calls: int = 0


def encoder_key() -> str:
    return f"sentence_encoder:{encoder_version()}"


def sentence_encoder(inference: InferenceResource) -> SentenceEncoder:
    """The packaged all-MiniLM-L6-v2, loaded on first use in this process."""
    return inference.model(encoder_key(), load_sentence_encoder)
