"""Trains the summaries' sentence scorer (``ranker_weights.safetensors``) on CNN/DailyMail,
with the fitting of :mod:`inference.text.train_ranker`.

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

    HF_HUB_OFFLINE=1 nice .venv/bin/python -m evaluation.train_ranker            # writes the weights
    HF_HUB_OFFLINE=1 nice .venv/bin/python -m evaluation.train_ranker --dry-run  # tuning table only
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from evaluation import summaries as ev
from evaluation.cnn_dailymail_bins import _SENTENCE, read_chunk
from inference.engine.device import make_runtime
from inference.text.encoder import load_sentence_encoder
from inference.text.rank import RankerSettings
from inference.text.ranker import WEIGHTS, TrainedRanker, load_ranker, sentence_features
from inference.text.segment import LengthCap, split_sentences
from inference.text.train_ranker import (
    LAMBDAS,
    NETWORKS,
    Article,
    fit,
    fit_network,
    greedy_oracle,
)

# See et al.'s training split lists its 90,266 CNN articles before the Daily Mail ones, in chunks
# of 1,000; these chunks are the ones github.com/habiburrahmankhan/Abstractive_text_summarization
# (commit a7ba0507) ships whole, three CNN and seven Daily Mail.
CHUNKS_REPO = ev._CHUNKS_REPO
CHUNKS_COMMIT = ev._CHUNKS_COMMIT
CNN_TRAINING_ARTICLES = 90_266
TRAIN_CHUNKS = ("000", "008", "016", "166", "182", "187", "192", "202", "208", "217")


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
