"""document_embeddings on real articles: highlight -> article retrieval on CNN/DailyMail.

Each article is embedded by the asset's own model (``EmbeddingPredictor`` of
``assets/embeddings/document_embeddings.py``, with its default config) and each article's
highlights as a query, embedded the same way (``embed_documents`` with the asset's chunking:
a query is a short document); the query's own article should rank first among all. Beside it:
the first-window embedding (``encode``: the encoder reads the first 256 tokens; ranked only
with ``--first-window``, which costs one more encoder pass over every article), the chunked
sentence vector without hashed words (the asset's previous method, "current"), the hashed words
alone, the textbook baseline TF-IDF cosine (sublinear tf, English stop words, fitted on the
articles and queries shown) and a random ranking. The ranking pools chunk vectors kept in a
cache (:class:`ChunkVectors`); throughput is docs/s of the three encoder methods on the first
``--timed-articles`` articles in this process, alternated, best of ``--repeats``, where the
asset's model step must give the ranking's vectors. Ratios are against "current", measured in
the same process.

Reported on the first 1,000 validation articles (mostly CNN, cased). The weights were chosen
with ``--sweep`` on other articles: every 8th of the validation chunks file (tokenised form,
mostly Daily Mail; none of the 1,000), the first :data:`TUNING_ARTICLES` of them. The data
sets, their sources and licences are those of ``evaluation/summaries.py`` (not committed;
``dataset_path`` says how to get them).

    python -m evaluation.embeddings --articles 1000 [--sweep] [--timed-articles 60]
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from sklearn.feature_extraction.text import TfidfVectorizer

from assets.embeddings.document_embeddings import (
    EmbeddingPredictor,
    EmbeddingsConfig,
    document_chunking,
    document_texts,
)
from assets.text_models import sentence_encoder
from evaluation.summaries import CACHE, VALIDATION_CHUNKS, dataset_path, load_examples
from inference.text.chunks import Chunking
from inference.text.embeddings import (
    document_chunks,
    embed_documents,
    encode,
    encode_tokens,
    pool_chunks,
    with_terms,
)
from inference.text.encoder import SentenceEncoder
from inference.text.lexical import HashedTerms
from inference.text.normalise import normalise_text
from resources.inference import InferenceResource

# The tuning slice: every TUNING_EVERY-th article of the validation chunks file, the first
# TUNING_ARTICLES of those not in the reported set.
TUNING_EVERY, TUNING_ARTICLES = 8, 500
# What --sweep tries on the tuning slice: chunks per document, hashed-word buckets, weights.
SWEEP_CHUNKS = (1, 2)
SWEEP_BUCKETS = (384, 1024, 2048, 4096)
SWEEP_WEIGHTS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def retrieval(similarity: np.ndarray) -> dict[str, float]:
    """Recall@1, @5, @10 and MRR when query i's relevant document is document i."""
    n = len(similarity)
    ranks = (similarity > similarity[np.arange(n), np.arange(n)][:, None]).sum(1)
    return {
        "recall_at_1": round(float(np.mean(ranks == 0)), 3),
        "recall_at_5": round(float(np.mean(ranks < 5)), 3),
        "recall_at_10": round(float(np.mean(ranks < 10)), 3),
        "mrr": round(float(np.mean(1 / (ranks + 1))), 3),
    }


def asset_embeddings(
    encoder: SentenceEncoder,
    inference: InferenceResource,
    config: EmbeddingsConfig,
    articles: Sequence[str],
) -> np.ndarray:
    """The articles' vectors as ``document_embeddings`` writes them: the asset's model step,
    in batches of its ``docs_per_chunk``, under the inference resource's token budget."""
    predictor = EmbeddingPredictor(
        chunks_per_document=config.chunks_per_document, chunk_decay=config.chunk_decay
    )
    predictor.max_batch_size = inference.max_batch_size
    predictor.max_batch_tokens = inference.batch_tokens
    predictor.use(encoder)
    out = []
    for start in range(0, len(articles), config.docs_per_chunk):
        part = list(articles[start : start + config.docs_per_chunk])
        batch = pa.record_batch(
            {
                "doc_id": [str(start + i) for i in range(len(part))],
                "title": pa.nulls(len(part), pa.string()),
                "body": part,
            }
        )
        written = predictor(batch, predictor.prepare(batch))
        out.append(np.stack(written["embedding"].to_numpy(zero_copy_only=False)))
    return np.concatenate(out).astype(np.float32)


def first_window(encoder: SentenceEncoder, inference: InferenceResource, texts: Sequence[str]):
    """The unchunked method: each text mean-pooled over the encoder's first window only."""
    return encode(encoder, texts, inference.batch_tokens, inference.max_batch_size).vectors.numpy()


def embedded(
    encoder: SentenceEncoder,
    inference: InferenceResource,
    chunking: Chunking,
    texts: Sequence[str],
) -> np.ndarray:
    """``embed_documents`` under the inference resource's budget (documents or queries)."""
    out = embed_documents(
        encoder, texts, chunking, inference.batch_tokens, inference.max_batch_size
    )
    return out.vectors.numpy()


def timed(
    runs: dict[str, Callable[[], np.ndarray]], repeats: int
) -> dict[str, tuple[float, np.ndarray]]:
    """Each run's best seconds over ``repeats`` rounds and its result. The runs alternate
    within a round, and each round starts one run later than the one before, so a load that
    rises or falls through the rounds does not always land on the same run."""
    best: dict[str, tuple[float, np.ndarray]] = {}
    names = list(runs)
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            run = runs[name]
            started = time.perf_counter()
            result = run()
            seconds = time.perf_counter() - started
            best[name] = (min(seconds, best.get(name, (seconds,))[0]), result)
    return best


def tfidf_similarity(texts: Sequence[str], queries: Sequence[str]) -> np.ndarray:
    """TF-IDF cosine of each query to each text, fitted on both."""
    tfidf = TfidfVectorizer(sublinear_tf=True, stop_words="english").fit([*texts, *queries])
    return (tfidf.transform(queries) @ tfidf.transform(texts).T).toarray()


class ChunkVectors:
    """Encoder vectors of token sequences (chunks, first windows), kept on disk between runs
    and keyed by their token ids: the ranking tables need every article's chunks once, however
    many poolings and weights are compared."""

    def __init__(self, encoder: SentenceEncoder, inference: InferenceResource, cache: Path):
        self.encoder, self.inference = encoder, inference
        self.file = cache / f"chunk-vectors-{encoder.version}.npz"
        self.vectors: dict[str, np.ndarray] = {}
        if self.file.exists():
            saved = np.load(self.file)
            self.vectors = dict(zip(saved["keys"].tolist(), saved["vectors"], strict=True))

    def __call__(self, ids: Sequence[Sequence[int]]) -> torch.Tensor:
        keys = [_key(i) for i in ids]
        missing = {k: i for k, i in zip(keys, ids, strict=True) if k not in self.vectors}
        if missing:
            out = encode_tokens(
                self.encoder,
                list(missing.values()),
                self.inference.batch_tokens,
                self.inference.max_batch_size,
            )
            self.vectors.update(zip(missing, out.vectors.numpy(), strict=True))
            self.save()
        width = self.encoder.model.config.hidden_size
        rows = [self.vectors[k] for k in keys]
        return torch.from_numpy(np.stack(rows)) if rows else torch.empty(0, width)

    def documents(self, texts: Sequence[str], chunking: Chunking) -> torch.Tensor:
        """What ``embed_documents`` gives with ``chunking``, from the kept chunk vectors."""
        chunks = document_chunks(self.encoder, texts, replace(chunking, terms=None))
        dense = pool_chunks(
            self([c for doc in chunks for c in doc]), [len(d) for d in chunks], chunking
        )
        if chunking.terms is None:
            return dense
        terms = torch.from_numpy(chunking.terms.vectors(texts))
        return with_terms(dense, terms, chunking.terms_weight)

    def first_window(self, texts: Sequence[str]) -> torch.Tensor:
        """What ``encode`` gives: each text's first window."""
        tokenizer = self.encoder.tokenizer
        return self(
            tokenizer(list(texts), truncation=True, max_length=self.encoder.max_length)["input_ids"]
        )

    def save(self) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(self.vectors), dtype="U40")
        np.savez(self.file, keys=keys, vectors=np.stack(list(self.vectors.values())))


def _key(ids: Sequence[int]) -> str:
    return hashlib.sha1(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()


def tuning_examples(reported: set[str]):
    """The tuning slice (:data:`TUNING_EVERY`, :data:`TUNING_ARTICLES`), none of ``reported``."""
    examples = load_examples(dataset_path(VALIDATION_CHUNKS))
    unseen = [e for e in examples if e.doc_id not in reported]
    return unseen[::TUNING_EVERY][:TUNING_ARTICLES]


def sweep(vectors: ChunkVectors, texts: Sequence[str], queries) -> dict[str, dict[str, float]]:
    """Retrieval on the tuning slice for each chunk count, bucket count and weight of the
    sweep, the asset's decay kept; queries embedded the same way as the articles."""
    asset = document_chunking(vectors.encoder, EmbeddingsConfig())
    out = {"TF-IDF cosine": retrieval(tfidf_similarity(texts, queries))}
    for k in SWEEP_CHUNKS:
        dense = replace(asset, max_chunks=k, terms=None)
        q, d = vectors.documents(queries, dense), vectors.documents(texts, dense)
        out[dense.describe()] = retrieval((q @ d.T).numpy())
        for buckets in SWEEP_BUCKETS:
            terms = HashedTerms(buckets)
            qt, dt = (
                torch.from_numpy(terms.vectors(queries)),
                torch.from_numpy(terms.vectors(texts)),
            )
            if k == SWEEP_CHUNKS[0]:
                out[f"{terms.describe()} alone"] = retrieval((qt @ dt.T).numpy())
            for weight in SWEEP_WEIGHTS:
                chunking = replace(dense, terms=terms, terms_weight=weight)
                a, b = with_terms(q, qt, weight), with_terms(d, dt, weight)
                out[chunking.describe()] = retrieval((a @ b.T).numpy())
    return out


def _table(title: str, rows: dict[str, dict[str, float]], current: str | None = None) -> str:
    ratios = current is not None
    head = f"| {title} | R@1 | R@5 | R@10 | MRR |" + (" R@1 / current | R@5 / current |" * ratios)
    lines = [head, "|---|" + "---:|" * (6 if ratios else 4)]
    for name, m in rows.items():
        line = f"| {name} | {m['recall_at_1']} | {m['recall_at_5']} | {m['recall_at_10']} | "
        line += f"{m['mrr']} |"
        if ratios:
            base = rows[current]
            line += f" {m['recall_at_1'] / base['recall_at_1']:.3f} |"
            line += f" {m['recall_at_5'] / base['recall_at_5']:.3f} |"
        lines.append(line)
    return "\n".join(lines)


def _speed_table(n: int, repeats: int, runs: dict[str, float], current: str, before: str) -> str:
    lines = [
        f"| embedding ({n} articles, best of {repeats}) | docs/s | / current | / first window |",
        "|---|---:|---:|---:|",
    ]
    for name, seconds in runs.items():
        lines.append(
            f"| {name} | {n / seconds:.2f} | {runs[current] / seconds:.2f} | "
            f"{runs[before] / seconds:.2f} |"
        )
    return "\n".join(lines)


def report(
    articles: int = 1000,
    repeats: int = 1,
    tune: bool = False,
    timed_articles: int = 100,
    first_windows: bool = False,
) -> str:
    """The retrieval and throughput tables (and with ``tune`` the sweep on the tuning slice)."""
    return "\n\n".join(report_parts(articles, repeats, tune, timed_articles, first_windows))


def report_parts(
    articles: int, repeats: int, tune: bool, timed_articles: int, first_windows: bool
) -> Iterator[str]:
    """The tables of :func:`report`, each as soon as it is measured.

    The ranking uses one encoder pass over every chunk (kept in the cache between runs), pooled
    as ``embed_documents`` pools; docs/s times the three methods on the first
    ``timed_articles`` articles, and the asset's own model step there must give the ranking's
    vectors."""
    examples = load_examples(dataset_path())[:articles]
    bodies = [e.article for e in examples]
    queries = [e.reference.replace("\n", " ") for e in examples]
    inference, config = InferenceResource(device="cpu"), EmbeddingsConfig()
    encoder = sentence_encoder(inference)
    chunking = document_chunking(encoder, config)
    current_chunking = replace(chunking, terms=None)
    texts = document_texts(
        pa.record_batch({"title": pa.nulls(len(bodies), pa.string()), "body": bodies})
    )
    asset = f"all-MiniLM-L6-v2, {chunking.describe()} (the asset)"
    current = f"all-MiniLM-L6-v2, {current_chunking.describe()} (current)"
    before = "all-MiniLM-L6-v2, first window only"
    vectors = ChunkVectors(encoder, inference, CACHE)
    first_q = vectors.first_window(queries)
    ranked = {
        current: (first_q, vectors.documents(texts, current_chunking)),
        asset: (vectors.documents(queries, chunking), vectors.documents(texts, chunking)),
    }
    if first_windows:  # one more encoder pass over every article
        ranked = {before: (first_q, vectors.first_window(texts)), **ranked}
    rows = {name: retrieval((q @ d.T).numpy()) for name, (q, d) in ranked.items()}
    assert chunking.terms is not None, "the asset's chunking hashes words"
    terms = chunking.terms
    rows[f"{terms.describe()} alone"] = retrieval(terms.vectors(queries) @ terms.vectors(texts).T)
    rows["TF-IDF cosine"] = retrieval(tfidf_similarity(texts, queries))
    rows["random"] = retrieval(np.random.default_rng(0).random((len(texts), len(texts))))
    yield _table(f"ranking ({len(texts)} articles)", rows, current)
    n = min(timed_articles, len(texts))
    runs = timed(
        {
            before: lambda: first_window(encoder, inference, texts[:n]),
            current: lambda: embedded(encoder, inference, current_chunking, texts[:n]),
            asset: lambda: asset_embeddings(encoder, inference, config, bodies[:n]),
        },
        repeats,
    )
    # The ranking's vectors are the asset's: the same chunks, only batched otherwise.
    assert np.allclose(runs[asset][1], ranked[asset][1][:n].numpy(), atol=1e-5)
    seconds = {name: s for name, (s, _) in runs.items()}
    yield _speed_table(n, repeats, seconds, current, before)
    yield f"ratio the asset / first window: {seconds[before] / seconds[asset]:.2f}"
    if tune:
        slice_ = tuning_examples({e.doc_id for e in examples})
        tuned = sweep(
            vectors,
            [normalise_text(e.article) for e in slice_],
            [e.reference.replace("\n", " ") for e in slice_],
        )
        yield _table(f"tuning slice ({len(slice_)} other articles)", tuned)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--articles", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1, help="timing rounds (best of)")
    parser.add_argument("--sweep", action="store_true", help="also the sweep on the tuning slice")
    parser.add_argument("--timed-articles", type=int, default=100, help="articles timed")
    parser.add_argument(
        "--first-window", action="store_true", help="also rank by the first window alone"
    )
    args = parser.parse_args()
    parts = report_parts(
        args.articles, args.repeats, args.sweep, args.timed_articles, args.first_window
    )
    for part in parts:
        print(part, end="\n\n", flush=True)


if __name__ == "__main__":
    main()
