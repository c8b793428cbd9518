"""Fits the summaries' sentence scorer (``ranker_weights.safetensors``): the greedy ROUGE oracle
that labels a training article's sentences, and the candidates fitted to those labels.

Each training article's sentences are labelled by a greedy ROUGE oracle: the up-to-three
sentences that, added one at a time, most raise ROUGE-1 plus ROUGE-2 F1 against the human
highlights (the labels of BertSum and SummaRuNNer). Logistic regression (three L2 weights) and
a network with one hidden layer (two sizes) over :func:`inference.text.ranker.sentence_features`,
the function the asset calls, then learn which sentences those are.

The articles, the tuning that keeps one candidate, and the command that writes the weights are
the evaluation's (:mod:`evaluation.train_ranker`): they read CNN/DailyMail and score with the
asset's own summariser.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import torch

from inference.text.ranker import TrainedRanker

LAMBDAS = (1e-4, 1e-3, 1e-2)
# The network candidates: (hidden units, weight decay), each trained for NETWORK_EPOCHS.
NETWORKS = ((32, 1e-4), (64, 1e-3))
NETWORK_EPOCHS = 4
# The oracle's most sentences: the summaries' cap.
ORACLE_SENTENCES = 3


@dataclass
class Article:
    """One training or tuning article in one form, its sentences and their oracle label."""

    dataset: str
    form: str
    source: str
    sentences: list[str]
    reference: str
    vectors: torch.Tensor | None = None
    features: torch.Tensor | None = None
    oracle: tuple[int, ...] = ()


@cache
def _tokenize():
    """rouge-score's own tokeniser (Porter-stemmed), built once: what ROUGE will count."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)._tokenizer.tokenize


def greedy_oracle(sentences: list[str], reference: str, k: int = ORACLE_SENTENCES) -> list[int]:
    """The sentences a greedy search picks, one at a time, while ROUGE-1 + ROUGE-2 F1 rises."""
    tokenize = _tokenize()
    reference_tokens = tokenize(reference)
    goal = (_grams(reference_tokens, 1), _grams(reference_tokens, 2))
    units = [(_grams(t, 1), _grams(t, 2)) for t in map(tokenize, sentences)]
    chosen: list[int] = []
    best, have = 0.0, (Counter(), Counter())
    for _ in range(k):
        pick = None
        for i, (one, two) in enumerate(units):
            if i in chosen:
                continue
            gain = _f1(have[0] + one, goal[0]) + _f1(have[1] + two, goal[1])
            if gain > best + 1e-9:
                best, pick = gain, i
        if pick is None:
            break
        chosen.append(pick)
        have = (have[0] + units[pick][0], have[1] + units[pick][1])
    return chosen


def _grams(tokens: list[str], n: int) -> Counter:
    return Counter(zip(*(tokens[i:] for i in range(n)), strict=False))


def _f1(candidate: Counter, reference: Counter) -> float:
    overlap = sum((candidate & reference).values())
    if not overlap:
        return 0.0
    precision, recall = overlap / sum(candidate.values()), overlap / sum(reference.values())
    return 2 * precision * recall / (precision + recall)


def fit(docs: Sequence[Article], l2: float) -> TrainedRanker:
    """Logistic regression of "in the oracle" on the standardised features (L-BFGS)."""
    z, y, mean, scale = _training_matrix(docs)
    weights = torch.zeros(z.shape[1], requires_grad=True)
    bias = torch.zeros(1, requires_grad=True)
    optimiser = torch.optim.LBFGS([weights, bias], max_iter=200, line_search_fn="strong_wolfe")
    loss_of = torch.nn.BCEWithLogitsLoss()

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        loss = loss_of(z @ weights + bias, y) + l2 * (weights * weights).sum()
        loss.backward()
        return loss

    optimiser.step(closure)
    return TrainedRanker(weights.detach(), float(bias.detach()), mean, scale)


def fit_network(
    docs: Sequence[Article], units: int, decay: float, epochs: int = NETWORK_EPOCHS
) -> TrainedRanker:
    """One hidden layer (GELU) trained on the same labels (AdamW, seeded: the same data gives
    the same weights)."""
    z, y, mean, scale = _training_matrix(docs)
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    network = torch.nn.Sequential(
        torch.nn.Linear(z.shape[1], units), torch.nn.GELU(), torch.nn.Linear(units, 1)
    )
    optimiser = torch.optim.AdamW(network.parameters(), lr=1e-3, weight_decay=decay)
    for _ in range(epochs):
        order = torch.randperm(len(z), generator=generator)
        for start in range(0, len(z), 512):
            rows = order[start : start + 512]
            logits = network(z[rows]).squeeze(-1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y[rows])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    first, last = network[0], network[2]
    return TrainedRanker(
        last.weight.detach()[0],
        float(last.bias.detach()),
        mean,
        scale,
        hidden=(first.weight.detach(), first.bias.detach()),
    )


def _training_matrix(
    docs: Sequence[Article],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The standardised features of every sentence, their labels, and the standardisation."""
    used = [d for d in docs if d.features is not None]
    x = torch.cat([d.features for d in used])
    y = torch.cat([_labels(d) for d in used])
    mean, scale = x.mean(0), x.std(0).clamp(min=1e-3)
    return (x - mean) / scale, y, mean, scale


def _labels(doc: Article) -> torch.Tensor:
    label = torch.zeros(len(doc.sentences))
    label[list(doc.oracle)] = 1.0
    return label
