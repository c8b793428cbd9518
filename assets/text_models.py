"""The text models the document domains share (the packaged sentence encoder, an abstractive
checkpoint), loaded once per process through the inference resource, and the figures of their
model calls."""

from __future__ import annotations

from dataclasses import dataclass

from inference.engine.metrics import BatchMetrics
from inference.generation.generate import (
    Generator,
    check_checkpoint,
    checkpoint_version,
    load_generator,
)
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


def generator_key(checkpoint_path: str | None) -> str:
    return f"abstractive:{checkpoint_version(check_checkpoint(checkpoint_path))}"


def abstractive_generator(inference: InferenceResource, checkpoint_path: str | None) -> Generator:
    """The configured local seq2seq or causal checkpoint, loaded on first use in this process."""
    key = generator_key(checkpoint_path)
    return inference.model(key, lambda runtime: load_generator(checkpoint_path, runtime))
