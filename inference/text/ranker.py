"""A sentence scorer trained on news highlights: which sentences a person would put in a summary.

Centrality and a lead prior (:mod:`inference.text.rank`) cannot tell a byline, a caption or a
quotation from the news itself; a model over each sentence's embedding, its place and its shape
can, because those sentences look alike from one article to the next. The model is a small
network with one hidden layer, or logistic regression, whichever the trainer
(:mod:`evaluation.train_ranker`, fitting with :mod:`inference.text.train_ranker`) finds better
on its tuning samples, trained on CNN/DailyMail articles whose label is the sentences a greedy
ROUGE oracle picks against the highlights; its weights ship beside this module
(``ranker_weights.safetensors``, whose header records the features and the data they were
trained on), so the summaries need no download and no training run.

:func:`sentence_features` is the one place the features are computed: the training script
calls it too, so what is trained is what runs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


WEIGHTS = Path(__file__).with_name("ranker_weights.safetensors")
# The first sentences, each a feature of its own: news puts its summary there.
LEAD_POSITIONS = 6
# A sentence shorter than this, in words, is rarely a summary's (a byline, a dateline, "Share").
SHORT_WORDS = 6
_QUOTE = re.compile(r"[\"“”]|``|''")
_DIGIT = re.compile(r"\d")
_BYLINE = re.compile(r"(?i)^(by\b|published:|updated:|last updated|\|)")
# Feature names, in column order; the weights file records them, so a change fails loudly.
SHAPE_FEATURES = (
    *(f"position_{i}" for i in range(LEAD_POSITIONS)),
    "inverse_position",
    "relative_position",
    "inverse_content_position",
    "log_sentences",
    "log_words",
    "short",
    "quote",
    "question",
    "digit",
    "byline",
    "centrality_later",
    "centrality_earlier",
    "similarity_to_document",
    "similarity_to_lead",
    "most_similar_earlier",
    "pacsum_centrality",
)
# PacSum's settings: the centrality feature's, and the unsupervised ranker's defaults.
PACSUM = {"lambda1": -0.5, "lambda2": 1.0, "beta": 0.3}


def sentence_features(sentences: list[str], vectors: torch.Tensor) -> torch.Tensor:
    """One row per sentence: its shape features (:data:`SHAPE_FEATURES`), then its embedding.

    Args:
        sentences: the document's sentences, in order.
        vectors: one unit-norm embedding per sentence.
    """
    import torch

    n = len(sentences)
    vectors = vectors.float()
    position = torch.arange(n, dtype=torch.float32)
    words = torch.tensor([_words(s) for s in sentences], dtype=torch.float32)
    content = (words >= SHORT_WORDS).float()
    # Place among the sentences that are not short: a Daily Mail byline pushes the lead down.
    content_position = torch.cumsum(content, 0) - content
    similarity = vectors @ vectors.T
    mean = torch.nn.functional.normalize(vectors.mean(0), dim=0)
    lead = torch.nn.functional.normalize(vectors[: min(3, n)].mean(0), dim=0)
    # How much a sentence repeats one before it (the first has none before it).
    before = torch.ones(n, n, dtype=torch.bool).tril(diagonal=-1)
    most_similar = similarity.masked_fill(~before, -1.0).max(1).values.clamp(min=0)
    later_sum, earlier_sum = _centrality(similarity)
    columns = [
        *((position == i).float() for i in range(LEAD_POSITIONS)),
        1.0 / (1.0 + position),
        position / max(1, n),
        1.0 / (1.0 + content_position),
        torch.full((n,), float(torch.log1p(torch.tensor(float(n))))),
        torch.log1p(words),
        1.0 - content,
        _flags(sentences, _QUOTE),
        torch.tensor([s.rstrip().endswith("?") for s in sentences], dtype=torch.float32),
        _flags(sentences, _DIGIT),
        torch.tensor([_is_byline(s) for s in sentences], dtype=torch.float32),
        later_sum,
        earlier_sum,
        vectors @ mean,
        vectors @ lead,
        most_similar,
        standardised(pacsum_centrality(vectors, **PACSUM)),
    ]
    return torch.cat([torch.stack(columns, dim=1), vectors], dim=1)


def is_furniture(sentence: str) -> bool:
    """A byline, a dateline, a credit: too short to say anything, or a byline's opening. The
    training articles have had theirs removed, so the model never learned to pass them over."""
    return _words(sentence) < SHORT_WORDS or _is_byline(sentence)


def _is_byline(sentence: str) -> bool:
    return bool(_BYLINE.match(sentence.strip()))


def _words(sentence: str) -> int:
    """Tokens with a letter or digit: the tokenised form's lone periods and quotes are not words."""
    return sum(1 for token in sentence.split() if any(c.isalnum() for c in token))


def pacsum_centrality(
    vectors: torch.Tensor, lambda1: float, lambda2: float, beta: float
) -> torch.Tensor:
    """Directed centrality of each row (a sentence, unit-norm) among the document's rows."""
    import torch

    n = len(vectors)
    if n < 2:
        return torch.zeros(n)
    similarity = vectors @ vectors.T
    off_diagonal = similarity[~torch.eye(n, dtype=torch.bool)]
    low, high = float(off_diagonal.min()), float(off_diagonal.max())
    edges = (similarity - (low + beta * (high - low))).clamp(min=0)
    edges.fill_diagonal_(0)
    later = torch.triu(edges, diagonal=1).sum(dim=1)
    earlier = torch.tril(edges, diagonal=-1).sum(dim=1)
    return lambda1 * earlier + lambda2 * later


def standardised(values: torch.Tensor) -> torch.Tensor:
    """Values less their mean, over their standard deviation (zeros when they do not vary)."""
    spread = float(values.std()) if len(values) > 1 else 0.0
    return (values - values.mean()) / spread if spread > 1e-9 else values * 0


def _flags(sentences: list[str], pattern: re.Pattern) -> torch.Tensor:
    import torch

    return torch.tensor([bool(pattern.search(s)) for s in sentences], dtype=torch.float32)


def _centrality(similarity: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean positive similarity to later and to earlier sentences (PacSum's two directions,
    as means so that a long document's sentences are not all central)."""
    import torch

    n = len(similarity)
    if n < 2:
        return torch.zeros(n), torch.zeros(n)
    edges = similarity.clamp(min=0)
    index = torch.arange(n, dtype=torch.float32)
    later = torch.triu(edges, diagonal=1).sum(1) / (n - 1 - index).clamp(min=1)
    earlier = torch.tril(edges, diagonal=-1).sum(1) / index.clamp(min=1)
    return later, earlier


@dataclass(frozen=True)
class TrainedRanker:
    """A scorer over standardised :func:`sentence_features`: logistic regression, or with one
    hidden layer (GELU) between the features and the log-odds when ``hidden`` is given."""

    weights: torch.Tensor
    bias: float
    mean: torch.Tensor
    scale: torch.Tensor
    # (weight [units, features], bias [units]) of the hidden layer, if any.
    hidden: tuple[torch.Tensor, torch.Tensor] | None = None

    def score(self, features: torch.Tensor) -> torch.Tensor:
        """Log-odds that each row's sentence belongs in the summary."""
        import torch

        inputs = (features - self.mean) / self.scale
        if self.hidden is not None:
            weight, bias = self.hidden
            inputs = torch.nn.functional.gelu(inputs @ weight.T + bias)
        return inputs @ self.weights + self.bias

    def save(self, path: Path, provenance: dict) -> None:
        """Writes the weights as safetensors; the header's metadata holds the feature names,
        the embedding width and ``provenance`` (JSON strings: the header holds only strings)."""
        import torch
        from safetensors.torch import save_file

        tensors = {
            "bias": torch.tensor([self.bias], dtype=torch.float32),
            "weights": _rounded(self.weights),
            "mean": _rounded(self.mean),
            "scale": _rounded(self.scale),
        }
        if self.hidden is not None:
            tensors["hidden_weight"] = _rounded(self.hidden[0])
            tensors["hidden_bias"] = _rounded(self.hidden[1])
        metadata = {
            "features": json.dumps(list(SHAPE_FEATURES)),
            "embedding_width": str(len(self.mean) - len(SHAPE_FEATURES)),
            "provenance": json.dumps(provenance),
        }
        save_file(tensors, str(path), metadata=metadata)


def _rounded(values: torch.Tensor) -> torch.Tensor:
    """To six decimals, in float32: a retrain on the same data writes the same file."""
    import torch

    rounded = [round(float(v), 6) for v in values.flatten()]
    return torch.tensor(rounded, dtype=torch.float32).reshape(values.shape)


def weights_metadata(path: Path = WEIGHTS) -> dict:
    """The weights file's header: ``features``, ``embedding_width`` and ``provenance``."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as saved:
        header = saved.metadata() or {}
    return {
        "features": json.loads(header.get("features", "[]")),
        "embedding_width": int(header.get("embedding_width", "0")),
        "provenance": json.loads(header.get("provenance", "{}")),
    }


@cache
def load_ranker(path: Path = WEIGHTS) -> TrainedRanker:
    """The packaged weights; fails, naming the file, if they were trained on other features."""
    from safetensors.torch import load_file

    features = weights_metadata(path)["features"]
    if tuple(features) != SHAPE_FEATURES:
        raise ValueError(
            f"{path}: trained on features {features}, this code computes "
            f"{list(SHAPE_FEATURES)}; retrain with python -m evaluation.train_ranker"
        )
    # Copied out of the file's buffer: its tensors sit at arbitrary byte offsets, and an
    # unaligned operand sends the matmul down another kernel, moving the scores in the 7th digit.
    saved = {name: tensor.clone() for name, tensor in load_file(str(path)).items()}
    hidden = None
    if "hidden_weight" in saved:
        hidden = (saved["hidden_weight"], saved["hidden_bias"])
    return TrainedRanker(
        weights=saved["weights"],
        bias=float(saved["bias"][0]),
        mean=saved["mean"],
        scale=saved["scale"],
        hidden=hidden,
    )
