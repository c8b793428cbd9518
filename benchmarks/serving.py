"""Workload 11: serving a night. A day of ``user_recommendations`` (users x K ranked items)
published to the embedded serving target (``SqliteTarget.publish``: a new version table loaded
in one transaction with its registry row and its key index, then the readers' view swapped to
it in a second one, older versions dropped) against a plain bulk insert of the same rows into
a table of the same file, in one transaction, with no index, registry or view.

Both convert the rows to Python values the same way and insert them with ``executemany`` in
batches of the target's ``batch_rows``, so the ratio is what the versioning, the index and the
swap cost over loading the rows at all. The two take turns (best of ``repeats`` each).

The vector figure: ``docs`` demo articles embedded by ``document_embeddings``' own model step
(the shipped MiniLM, offline) and published as a version of ``document_embeddings``, with its
HNSW index; queries are as many other articles again (up to ``QUERIES``), embedded the same way.
Recall@10 of ``search`` (the index) against ``search_exact`` (every vector compared), and the
queries/s of the two, one query at a time, alternated, best of ``repeats``. The same on real
news, and the index at scale when sizes are asked for: ``benchmarks/serving_ann.py``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.common import Workload, best_alternated
from benchmarks.serving_ann import news_search, scale_sweep, search_figures
from resources.serving import SqliteTarget

ASSET = "user_recommendations"
DAY = "2026-03-01"
DOCS = "document_embeddings"
QUERIES = 500


@dataclass(frozen=True)
class VectorRuns:
    """The vector figures beyond the demo articles': real news, and the index at scale."""

    news_docs: int = 0
    news_queries: int = QUERIES
    ann_sizes: Sequence[int] = ()
    # (M, efConstruction, efSearch) per run at each size; none: the target's own.
    ann_settings: Sequence[tuple[int, int, int]] = ()
    cache: Path | None = None

    def settings(self) -> list[tuple[int, int, int]]:
        fields = SqliteTarget.model_fields
        own = tuple(fields[name].default for name in ("hnsw_m", "ef_construction", "ef_search"))
        return list(self.ann_settings) or [own]


def hnsw_setting(text: str) -> tuple[int, int, int]:
    """``M:efConstruction:efSearch`` as three integers."""
    try:
        m, ef_construction, ef_search = (int(part) for part in text.split(":"))
    except ValueError:
        raise ValueError(f"an HNSW setting is M:efConstruction:efSearch, got {text!r}") from None
    return m, ef_construction, ef_search


def recommendations_day(users: int, k: int, items: int, seed: int = 0) -> pa.Table:
    """A day's lists: each user's top ``k`` items, ranked by a falling score."""
    rng = np.random.default_rng(seed)
    user = np.repeat(np.arange(users), k)
    rank = np.tile(np.arange(1, k + 1, dtype=np.int32), users)
    score = np.sort(rng.random((users, k), dtype=np.float32), axis=1)[:, ::-1].ravel()
    item = rng.integers(0, items, users * k)
    return pa.table(
        {
            "user_id": pc.binary_join_element_wise("u", pa.array(user).cast(pa.string()), ""),
            "rank": pa.array(rank),
            "item_id": pc.binary_join_element_wise("i", pa.array(item).cast(pa.string()), ""),
            "score": pa.array(score),
            "model_version": pa.array(["ease-1"] * (users * k)),
        }
    )


def _plain_insert(path: Path, rows: pa.Table, batch_rows: int) -> int:
    """The peer: one table replaced and filled in one transaction, nothing else."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        cursor = connection.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        cursor.execute("DROP TABLE IF EXISTS plain_recommendations")
        cursor.execute(
            "CREATE TABLE plain_recommendations "
            "(user_id TEXT, rank INTEGER, item_id TEXT, score REAL, model_version TEXT)"
        )
        for batch in rows.to_batches(max_chunksize=batch_rows):
            values = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
            cursor.executemany(
                "INSERT INTO plain_recommendations VALUES (?, ?, ?, ?, ?)",
                list(zip(*values, strict=True)),
            )
        cursor.execute("COMMIT")
    finally:
        connection.close()
    return rows.num_rows


def embedded_articles(count: int, seed: int) -> np.ndarray:
    """``count`` demo articles' vectors as ``document_embeddings`` writes them."""
    from assets.documents.demo_data import demo_articles
    from assets.embeddings.document_embeddings import EmbeddingsConfig
    from assets.text_models import sentence_encoder
    from evaluation.embeddings import asset_embeddings
    from resources.inference import InferenceResource

    inference = InferenceResource(device="cpu")
    texts = [f"{title}\n\n{body}" for title, body in demo_articles(count, seed)]
    return asset_embeddings(sentence_encoder(inference), inference, EmbeddingsConfig(), texts)


def vectors(workload: Workload, work: Path, docs: int, repeats: int) -> None:
    """The vector figure (see the module's docstring), added to ``workload``."""
    queries = min(QUERIES, docs)
    matrix, asked = embedded_articles(docs, seed=0), embedded_articles(queries, seed=1)
    dim = matrix.shape[1]
    rows = pa.table(
        {
            "doc_id": [f"doc-{n:06d}" for n in range(docs)],
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(matrix.ravel()), dim),
            "model_version": ["minilm"] * docs,
        }
    )
    target = SqliteTarget(path=str(work / "serving" / "vectors.sqlite"))
    version = target.publish(DOCS, rows, partition=DAY)
    got = search_figures(target, asked, repeats)
    recall, ann_s, exact_s = got["recall"], got["ann_s"], got["exact_s"]
    workload.compare(
        "SqliteTarget.search: the version's HNSW index (inner product on unit vectors)",
        "SqliteTarget.search_exact: cosine against every vector of the version",
        queries / ann_s,
        queries / exact_s,
        "queries/s",
        True,
        note=f"{docs:,} demo articles x {dim} dims (the asset's model step), {queries} other "
        f"articles as queries, k=10; recall@10 against exact {recall:.3f}; "
        f"M={target.hnsw_m}, efSearch={target.ef_search}; load {version.load_seconds:.2f} s",
    )
    workload.facts.update(
        {
            "docs": docs,
            "dims": dim,
            "queries": queries,
            "recall_at_10": recall,
            "ann_s": ann_s,
            "exact_s": exact_s,
            "vector_load_s": version.load_seconds,
        }
    )


def run(
    work: Path,
    users: int,
    k: int,
    items: int,
    repeats: int,
    docs: int = 0,
    more: VectorRuns | None = None,
) -> Workload:
    rows = recommendations_day(users, k, items)
    path = work / "serving" / "serving.sqlite"
    target = SqliteTarget(path=str(path), keep_versions=2)
    target.publish(ASSET, rows, partition=DAY)  # the registry and a current view exist first

    best = best_alternated(
        {
            "serving": lambda: target.publish(ASSET, rows, partition=DAY),
            "plain": lambda: _plain_insert(path, rows, target.batch_rows),
        },
        repeats,
    )
    served, serving_s = best["serving"]
    _, plain_s = best["plain"]
    assert target.read_current(ASSET).num_rows == rows.num_rows == served.rows
    workload = Workload("11 serving")
    workload.compare(
        "SqliteTarget.publish: a new version, its key index, the registry row, the view swap",
        "plain bulk insert of the same rows into the same file, one transaction",
        rows.num_rows / serving_s,
        rows.num_rows / plain_s,
        "rows/s",
        True,
        note=f"{users:,} users x top {k}; best of {repeats} alternated; "
        f"{serving_s:.2f} s against {plain_s:.2f} s",
    )
    workload.facts.update(
        {
            "rows": rows.num_rows,
            "serving_s": serving_s,
            "plain_s": plain_s,
            "version": served.version,
        }
    )
    if docs:
        vectors(workload, work, docs, repeats)
    more = more or VectorRuns()
    if more.news_docs:
        news_search(workload, work, more.news_docs, more.news_queries, repeats, more.cache)
    if more.ann_sizes:
        scale_sweep(
            workload,
            work,
            more.ann_sizes,
            more.news_queries,
            repeats,
            more.cache,
            more.settings(),
        )
    return workload
