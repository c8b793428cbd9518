"""document_embeddings on real articles: highlight -> article retrieval on CNN/DailyMail.

Each article is embedded by the asset's own model step (``document_texts`` and ``embed_batch``
of ``assets/embeddings/document_embeddings.py``, with its default config), each article's
highlights as a query (``encode``, as a search would embed it); the query's own article should
rank first among all. Beside it the first-window embedding (``encode`` of the whole text: the
encoder reads its first 256 tokens), the textbook baseline, TF-IDF cosine (sublinear tf,
English stop words, fitted on the articles and queries shown), and a random ranking. Figures
are given apart for a tuning third of the articles (every third one, where the chunking was
chosen), for the other two thirds (reported; each part ranks among its own articles only) and
for all of them. Throughput is docs/s of the first-window and the chunked embedding of all the
articles in this process, alternated, best of ``--repeats``. ``--sweep`` adds the chunking
alternatives on the tuning third. The data set, its source and licence are those of
``benchmarks/eval_summaries.py`` (not committed; ``dataset_path`` says how).

    python -m benchmarks.eval_embeddings --articles 1000
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
from sklearn.feature_extraction.text import TfidfVectorizer

from assets.embeddings.document_embeddings import (
    EmbeddingsConfig,
    document_chunking,
    document_texts,
    embed_batch,
    vectors_version,
)
from assets.text_models import ModelMetrics, sentence_encoder
from benchmarks.eval_summaries import dataset_path, load_examples
from inference.chunks import Chunking
from inference.embeddings import document_chunks, encode, encode_tokens, pool_chunks
from inference.encoder import SentenceEncoder
from resources.inference import InferenceResource

# Chunkings tried on the tuning part by --sweep: (chunks per document, decay).
SWEEP = [(1, 1.0), (2, 1.0), (2, 0.7), (2, 0.5), (2, 0.3), (3, 1.0), (3, 0.5), (4, 0.5)]


def retrieval(similarity: np.ndarray) -> dict[str, float]:
    """Recall@1, recall@10 and MRR when query i's relevant document is document i."""
    n = len(similarity)
    ranks = (similarity > similarity[np.arange(n), np.arange(n)][:, None]).sum(1)
    return {
        "recall_at_1": round(float(np.mean(ranks == 0)), 3),
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
    chunking = document_chunking(encoder, config)
    version = vectors_version(encoder, chunking)
    transform = embed_batch(
        encoder, chunking, version, ModelMetrics(), inference.batch_tokens, inference.max_batch_size
    )
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
        written = transform(batch, document_texts(batch))
        out.append(np.stack(written["embedding"].to_numpy(zero_copy_only=False)))
    return np.concatenate(out).astype(np.float32)


def first_window(encoder: SentenceEncoder, inference: InferenceResource, texts: Sequence[str]):
    """The previous method: each text mean-pooled over the encoder's first window only."""
    return encode(encoder, texts, inference.batch_tokens, inference.max_batch_size).vectors.numpy()


def timed(
    runs: dict[str, Callable[[], np.ndarray]], repeats: int
) -> dict[str, tuple[float, np.ndarray]]:
    """Each run's best seconds over ``repeats`` rounds (the runs alternated within a round, so a
    change of machine load falls on both) and its result."""
    best: dict[str, tuple[float, np.ndarray]] = {}
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            result = run()
            seconds = time.perf_counter() - started
            best[name] = (min(seconds, best.get(name, (seconds,))[0]), result)
    return best


def sweep(
    encoder: SentenceEncoder, inference: InferenceResource, texts: Sequence[str]
) -> dict[str, np.ndarray]:
    """Document vectors for each chunking of :data:`SWEEP`, from one embedding of every chunk
    (the first k chunks of a cut are the cut into k chunks)."""
    most = Chunking(encoder.max_length, max(k for k, _ in SWEEP))
    chunks = document_chunks(encoder, texts, most)
    flat = [chunk for doc in chunks for chunk in doc]
    vectors = encode_tokens(encoder, flat, inference.batch_tokens, inference.max_batch_size)
    counts = [len(doc) for doc in chunks]
    out = {}
    for k, decay in SWEEP:
        chunking = Chunking(encoder.max_length, k, decay)
        cost = np.mean([sum(len(c) for c in doc[:k]) for doc in chunks])
        name = f"{chunking.describe()} ({cost:.0f} tokens/doc)"
        out[name] = pool_chunks(vectors.vectors, counts, chunking).numpy()
    return out


def _table(title: str, rows: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [
        f"| {title} | tune R@1 | tune MRR | report R@1 | report R@10 | report MRR | all R@1 "
        "| all MRR |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, parts in rows.items():
        t, r, a = parts["tune"], parts["report"], parts["all"]
        lines.append(
            f"| {name} | {t['recall_at_1']} | {t['mrr']} | {r['recall_at_1']} | "
            f"{r['recall_at_10']} | {r['mrr']} | {a['recall_at_1']} | {a['mrr']} |"
        )
    return "\n".join(lines)


def _parts(score: Callable[[np.ndarray], np.ndarray], n: int) -> dict[str, dict[str, float]]:
    index = np.arange(n)
    return {
        part: retrieval(score(index[mask]))
        for part, mask in (
            ("tune", index % 3 == 0),
            ("report", index % 3 != 0),
            ("all", index >= 0),
        )
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--articles", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1, help="timing rounds (best of)")
    parser.add_argument("--sweep", action="store_true", help="also the chunking alternatives")
    args = parser.parse_args()
    examples = load_examples(dataset_path())[: args.articles]
    articles = [e.article for e in examples]
    queries = [e.reference.replace("\n", " ") for e in examples]
    inference, config = InferenceResource(device="cpu"), EmbeddingsConfig()
    encoder = sentence_encoder(inference)
    chunking = document_chunking(encoder, config)
    texts = document_texts(
        pa.record_batch({"title": pa.nulls(len(articles), pa.string()), "body": articles})
    )
    q = first_window(encoder, inference, queries)
    asset = f"all-MiniLM-L6-v2, {chunking.describe()} (the asset)"
    before = "all-MiniLM-L6-v2, first window only (before)"
    runs = timed(
        {
            before: lambda: first_window(encoder, inference, texts),
            asset: lambda: asset_embeddings(encoder, inference, config, articles),
        },
        args.repeats,
    )
    dense = {name: vectors for name, (_, vectors) in runs.items()}
    tfidf = TfidfVectorizer(sublinear_tf=True, stop_words="english").fit(texts + queries)
    lexical = (tfidf.transform(queries) @ tfidf.transform(texts).T).toarray()
    noise = np.random.default_rng(0).random((len(texts), len(texts)))
    rows = {name: _parts(lambda i, d=d: q[i] @ d[i].T, len(texts)) for name, d in dense.items()}
    rows["TF-IDF cosine"] = _parts(lambda i: lexical[np.ix_(i, i)], len(texts))
    rows["random"] = _parts(lambda i: noise[np.ix_(i, i)], len(texts))
    print(_table(f"ranking ({len(texts)} articles)", rows))
    if args.sweep:  # the alternatives, on the tuning third only: the choice is made there
        tune = np.arange(len(texts))[np.arange(len(texts)) % 3 == 0]
        alternatives = sweep(encoder, inference, [texts[i] for i in tune])
        print(f"\n| chunking, tuning third ({len(tune)} articles) | R@1 | R@10 | MRR |")
        print("|---|---:|---:|---:|")
        for name, d in alternatives.items():
            m = retrieval(q[tune] @ d.T)
            print(f"| {name} | {m['recall_at_1']} | {m['recall_at_10']} | {m['mrr']} |")
    print(f"\n| embedding ({len(texts)} articles, best of {args.repeats}) | docs/s |\n|---|---:|")
    for name, (seconds, _) in runs.items():
        print(f"| {name} | {len(texts) / seconds:.1f} |")
    print(f"\nratio the asset / first window: {runs[before][0] / runs[asset][0]:.2f}")


if __name__ == "__main__":
    main()
