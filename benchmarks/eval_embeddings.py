"""document_embeddings on real articles: highlight -> article retrieval on CNN/DailyMail.

Each article is embedded as the asset embeds a document (``search_text`` and ``encode``, the
packaged all-MiniLM-L6-v2), each article's highlights as a query; the query's own article should
rank first among all. Beside it the textbook baseline, TF-IDF cosine (sublinear tf, English
stop words), and a random ranking. The data set, its source and licence are those of
``benchmarks/eval_summaries.py`` (not committed; ``dataset_path`` says how to get it).

    python -m benchmarks.eval_embeddings --articles 1000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer

from assets.embeddings.document_embeddings import search_text
from assets.summaries.models import sentence_encoder
from benchmarks.eval_summaries import dataset_path, load_examples
from inference.embeddings import encode
from resources.inference import InferenceResource


def retrieval(similarity: np.ndarray) -> dict[str, float]:
    """Recall@1, recall@10 and MRR when query i's relevant document is document i."""
    n = len(similarity)
    ranks = (similarity > similarity[np.arange(n), np.arange(n)][:, None]).sum(1)
    return {
        "recall_at_1": round(float(np.mean(ranks == 0)), 3),
        "recall_at_10": round(float(np.mean(ranks < 10)), 3),
        "mrr": round(float(np.mean(1 / (ranks + 1))), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--articles", type=int, default=1000)
    args = parser.parse_args()
    examples = load_examples(dataset_path())[: args.articles]
    docs = [search_text(None, e.article) for e in examples]
    queries = [e.reference.replace("\n", " ") for e in examples]
    encoder = sentence_encoder(InferenceResource(device="cpu"))
    started = time.perf_counter()
    d, q = (
        encode(encoder, texts, max_batch_tokens=8192, max_batch_size=64).vectors.numpy()
        for texts in (docs, queries)
    )
    seconds = time.perf_counter() - started
    tfidf = TfidfVectorizer(sublinear_tf=True, stop_words="english").fit(docs + queries)
    rows = {
        "all-MiniLM-L6-v2 (the asset)": retrieval(q @ d.T),
        "TF-IDF cosine": retrieval((tfidf.transform(queries) @ tfidf.transform(docs).T).toarray()),
        "random": retrieval(np.random.default_rng(0).random((len(docs), len(docs)))),
    }
    print(f"| ranking ({len(docs)} articles) | recall@1 | recall@10 | MRR |\n|---|---:|---:|---:|")
    for name, m in rows.items():
        print(f"| {name} | {m['recall_at_1']} | {m['recall_at_10']} | {m['mrr']} |")
    print(f"embedded {2 * len(docs)} texts in {seconds:.1f} s ({2 * len(docs) / seconds:.1f}/s)")


if __name__ == "__main__":
    main()
