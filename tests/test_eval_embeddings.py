"""The embeddings evaluation: its retrieval figures, and that its vectors are the asset's own."""

import importlib
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
from dagster import materialize

from assets.documents.assets import documents
from assets.documents.schemas import DOCUMENTS_SCHEMA
from assets.embeddings.document_embeddings import EmbeddingsConfig, document_embeddings
from assets.text_models import sentence_encoder
from evaluation import embeddings as eval_embeddings
from evaluation.embeddings import asset_embeddings, first_window, retrieval
from evaluation.summaries import load_examples

TINY = Path(__file__).parent / "fixtures" / "summaries_eval_tiny.csv"
DAY = "2026-03-02"
LEAD = "The harbour board met on Monday and agreed a plan to dredge the channel by summer. " * 20


def test_retrieval_scores_the_rank_of_each_querys_own_document() -> None:
    perfect = {"recall_at_1": 1.0, "recall_at_5": 1.0, "recall_at_10": 1.0, "mrr": 1.0}
    assert retrieval(np.eye(4)) == perfect
    # Query 0 ranks its document second, query 1 third, queries 2 and 3 first.
    similarity = np.array(
        [[0.5, 0.9, 0.1, 0.0], [0.8, 0.2, 0.7, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]]
    )
    assert retrieval(similarity) == {
        "recall_at_1": 0.5,
        "recall_at_5": 1.0,
        "recall_at_10": 1.0,
        "mrr": round((1 / 2 + 1 / 3 + 1 + 1) / 4, 3),
    }


def _articles() -> list[str]:
    short = [e.article for e in load_examples(TINY)]
    return [
        *short,
        LEAD + "Fishermen welcomed it.",
        LEAD + "Environmental groups said they would sue.",
    ]


def test_the_evals_vectors_are_the_ones_the_asset_publishes(store, resources, instance) -> None:
    articles = _articles()
    noon = int(datetime.fromisoformat(DAY).replace(tzinfo=UTC).timestamp() * 1e6) + 43_200_000_000
    landed = pa.table(
        {
            "doc_id": [str(i) for i in range(len(articles))],
            "published_at": pa.array([noon] * len(articles), pa.timestamp("us", tz="UTC")),
            "title": pa.nulls(len(articles), pa.string()),
            "body": articles,
        },
        schema=DOCUMENTS_SCHEMA,
    )
    store.write_landing("documents", DAY, landed)
    assert materialize(
        [documents, document_embeddings], resources=resources, instance=instance, partition_key=DAY
    ).success
    published = store.read_output("document_embeddings", DAY)
    assert published["doc_id"].to_pylist() == landed["doc_id"].to_pylist()
    written = np.stack(published["embedding"].to_numpy(zero_copy_only=False))
    inference = resources["inference"]
    encoder = sentence_encoder(inference)
    ours = asset_embeddings(encoder, inference, EmbeddingsConfig(), articles)
    assert np.array_equal(ours, written)
    # The long articles differ only past the first window: the previous method saw no difference.
    before = first_window(encoder, inference, articles)
    assert np.array_equal(before[-1], before[-2]) and not np.array_equal(ours[-1], ours[-2])


def test_the_evals_asset_row_goes_through_the_assets_model_step(
    monkeypatch, capsys, tmp_path
) -> None:
    module = importlib.import_module("assets.embeddings.document_embeddings")
    real, seen = module.embed_documents, []

    def spy(encoder, texts, chunking, **kwargs):
        seen.append((list(texts), chunking))
        return real(encoder, texts, chunking, **kwargs)

    monkeypatch.setattr(module, "embed_documents", spy)
    monkeypatch.setattr(eval_embeddings, "dataset_path", lambda: TINY)
    monkeypatch.setattr(eval_embeddings, "CACHE", tmp_path)
    monkeypatch.setattr(sys, "argv", ["eval_embeddings", "--articles", "4"])
    eval_embeddings.main()
    printed = capsys.readouterr().out
    articles = [e.article for e in load_examples(TINY)]
    [(texts, chunking)] = seen
    assert texts == articles and chunking == module.document_chunking(
        sentence_encoder(eval_embeddings.InferenceResource(device="cpu")), EmbeddingsConfig()
    )
    assert f"all-MiniLM-L6-v2, {chunking.describe()} (the asset)" in printed
    assert "TF-IDF cosine" in printed and "ratio the asset / first window" in printed


def test_make_eval_prints_the_embeddings_tables(monkeypatch, capsys, tmp_path) -> None:
    from evaluation import run as eval_driver

    monkeypatch.setattr(eval_embeddings, "dataset_path", lambda: TINY)
    monkeypatch.setattr(eval_embeddings, "CACHE", tmp_path)
    real, called = eval_embeddings.report, []

    def four_articles() -> str:
        called.append(True)
        return real(articles=4)

    monkeypatch.setattr(eval_embeddings, "report", four_articles)
    assert eval_driver.main(["--only", "embeddings"]) == 0
    printed = capsys.readouterr().out
    assert called and "## embeddings" in printed
    # The chunk vectors are kept in the cache, not recomputed on the next run.
    assert list(tmp_path.glob("chunk-vectors-*.npz"))
    assert "(the asset)" in printed and "TF-IDF cosine" in printed and "docs/s" in printed
