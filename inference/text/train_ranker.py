"""Trains the summaries' sentence scorer (``ranker_weights.safetensors``) on CNN/DailyMail.

Each training article's sentences are labelled by a greedy ROUGE oracle: the up-to-three
sentences that, added one at a time, most raise ROUGE-1 plus ROUGE-2 F1 against the human
highlights (the labels of BertSum and SummaRuNNer). Logistic regression (three L2 weights) and
a network with one hidden layer (two sizes) over :func:`inference.text.ranker.sentence_features`,
the function the asset calls, then learn which sentences those are. The candidate kept has the
best worst ROUGE-1 margin over Lead-3 on any source of the evaluation's tuning samples; the
reported samples and the test articles are never trained or tuned on.

The data (not committed; the publishers' copyright, distributed for research):

- training articles: See et al.'s tokenised training chunks (:data:`TRAIN_CHUNKS`, CNN and Daily
  Mail), and the validation articles of :mod:`evaluation.summaries` outside its tuning and
  report samples, in both forms where the cased text exists;
- tuning: those sets' tuning samples.

    HF_HUB_OFFLINE=1 nice .venv/bin/python -m inference.text.train_ranker            # writes the weights
    HF_HUB_OFFLINE=1 nice .venv/bin/python -m inference.text.train_ranker --dry-run  # tuning table only
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

from evaluation import summaries as ev
from evaluation.cnn_dailymail_bins import _SENTENCE, read_chunk
from inference.engine.device import make_runtime
from inference.text.encoder import load_sentence_encoder
from inference.text.rank import RankerSettings
from inference.text.ranker import WEIGHTS, TrainedRanker, load_ranker, sentence_features
from inference.text.segment import LengthCap, split_sentences

# See et al.'s training split lists its 90,266 CNN articles before the Daily Mail ones, in chunks
# of 1,000; these chunks are the ones github.com/habiburrahmankhan/Abstractive_text_summarization
# (commit a7ba0507) ships whole, three CNN and seven Daily Mail.
CHUNKS_REPO = ev._CHUNKS_REPO
CHUNKS_COMMIT = ev._CHUNKS_COMMIT
CNN_TRAINING_ARTICLES = 90_266
TRAIN_CHUNKS = ("000", "008", "016", "166", "182", "187", "192", "202", "208", "217")
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


def training_chunks(cache: Path = ev.CACHE) -> list[ev.Example]:
    """The training chunks' articles, read from ``cache/chunks/train_NNN.bin``."""
    examples = []
    for name in TRAIN_CHUNKS:
        path = cache / "chunks" / f"train_{name}.bin"
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing. Get it with: git clone https://{CHUNKS_REPO} chunks && "
                f"git -C chunks show {CHUNKS_COMMIT}:chunked/train_{name}.bin > {path}"
            )
        source = "cnn" if 1000 * int(name) < CNN_TRAINING_ARTICLES else "dailymail"
        for k, record in enumerate(read_chunk(path)):
            highlights = _SENTENCE.findall(record.get("abstract", ""))
            if record.get("article", "").strip() and highlights:
                key = hashlib.sha1(f"train_{name}:{k}".encode()).hexdigest()
                examples.append(ev.Example(key, record["article"], "\n".join(highlights), source))
    return examples


def articles(cache: Path = ev.CACHE) -> tuple[list[Article], list[Article]]:
    """The training and the tuning articles, in every form each has."""
    train = [
        Article("train_chunks", "tokenised", e.source or "unknown", *_form(e, "tokenised", True))
        for e in training_chunks(cache)
    ]
    tuning = []
    for dataset in (ev.VALIDATION_CHUNKS, ev.CNN_DAILYMAIL):
        examples = ev.load_examples(ev.dataset_path(dataset, cache))
        urls = ev.dataset_path(ev.VALIDATION_URLS, cache)
        source = ev.article_sources(examples, urls)
        reported = {
            e.doc_id
            for offset in ev.report_offsets(dataset.every)
            for e in ev.every_kth(examples, dataset.every, offset)
        }
        tuned = {
            e.doc_id
            for offset in dataset.tuning
            for e in ev.every_kth(examples, dataset.every, offset)
        }
        pretokenised = dataset.forms == ("tokenised",)
        for e in examples:
            if e.doc_id in reported:
                continue
            for form in dataset.forms:
                into = tuning if e.doc_id in tuned else train
                into.append(
                    Article(dataset.name, form, source[e.doc_id], *_form(e, form, pretokenised))
                )
    return train, tuning


def _form(example: ev.Example, form: str, pretokenised: bool) -> tuple[list[str], str]:
    article, reference = ev.forms(example, pretokenised)[form]
    return split_sentences(article), reference


def featurise(docs: Sequence[Article], cache: Path = ev.CACHE) -> None:
    """Sets each article's features (through the eval's embedding cache) and oracle label."""
    embed = ev.CachedEmbeddings(load_sentence_encoder(make_runtime("cpu", "fp32")), cache)
    try:
        for doc in docs:
            if len(doc.sentences) >= 3:
                doc.vectors = embed(doc.sentences)
                doc.features = sentence_features(doc.sentences, doc.vectors)
                doc.oracle = tuple(greedy_oracle(doc.sentences, doc.reference))
    finally:
        embed.save()


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


def margins(docs: Sequence[Article], ranker: TrainedRanker, scratch: Path) -> dict[str, float]:
    """Mean ROUGE-1 margin over Lead-3 per dataset, source and form, through the asset's own
    summariser (:func:`inference.text.text.summarise_sentences`) with ``ranker``'s weights,
    under the asset's default length cap."""
    from inference.text.text import summarise_sentences

    cap = LengthCap()
    ranker.save(scratch, {})
    settings = RankerSettings(weights=str(scratch))
    load_ranker.cache_clear()  # the scratch file is the same path for every candidate
    scored = [d for d in docs if d.features is not None]
    ours = [summarise_sentences(d.sentences, d.vectors, cap, settings) for d in scored]
    gains = ev._rouge1_each([(s, d.reference) for s, d in zip(ours, scored, strict=True)])
    gains -= ev._rouge1_each([(" ".join(d.sentences[:3]), d.reference) for d in scored])
    out: dict[str, list[float]] = {}
    for doc, gain in zip(scored, gains, strict=True):
        out.setdefault(f"{doc.dataset} {doc.source} ({doc.form})", []).append(float(gain))
    return {k: float(np.mean(v)) for k, v in out.items() if len(v) >= ev.MIN_DOCUMENTS}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, default=ev.CACHE)
    parser.add_argument("--out", type=Path, default=WEIGHTS)
    parser.add_argument("--dry-run", action="store_true", help="print the tuning table only")
    args = parser.parse_args(argv)
    train, tuning = articles(args.cache)
    featurise([*train, *tuning], args.cache)
    print(f"training on {sum(d.features is not None for d in train)} articles (forms apart)")
    candidates = {f"logistic l2={l2:g}": lambda l2=l2: fit(train, l2) for l2 in LAMBDAS}
    for units, decay in NETWORKS:
        candidates[f"network units={units} decay={decay:g}"] = lambda units=units, decay=decay: (
            fit_network(train, units, decay)
        )
    best = None
    for name, train_one in candidates.items():
        ranker = train_one()
        gains = margins(tuning, ranker, args.out.with_suffix(".candidate.safetensors"))
        worst = min(gains.values())
        print(f"{name}: worst margin {worst:+.2f}", {k: round(v, 2) for k, v in gains.items()})
        if best is None or worst > best[0]:
            best = (worst, name, ranker)
    assert best is not None
    _, chosen, ranker = best
    if not args.dry_run:
        provenance = {
            "trainer": "inference/text/train_ranker.py",
            "labels": "greedy ROUGE-1+2 oracle, up to 3 sentences, against the highlights",
            "model": chosen,
            "training_articles": {
                f"{k[0]} {k[1]} ({k[2]})": v
                for k, v in Counter(
                    (d.dataset, d.source, d.form) for d in train if d.features is not None
                ).items()
            },
            "data": f"CNN/DailyMail (Hermann et al. 2015), See et al.'s tokenised chunks "
            f"train_{{{','.join(TRAIN_CHUNKS)}}}.bin of {CHUNKS_REPO} commit {CHUNKS_COMMIT}, "
            "and the validation articles outside evaluation.summaries' tuning and report "
            "samples; articles copyright CNN and the Daily Mail, distributed for research",
        }
        ranker.save(args.out, provenance)
        print(f"wrote {args.out} ({chosen})")
    args.out.with_suffix(".candidate.safetensors").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
