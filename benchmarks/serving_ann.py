"""Workload 11's vector search on real news, and the index at scale.

Real news: ``docs`` documents of the committed News Category sample (``news_corpus``)
embedded by ``document_embeddings``' own model step and published through the serving
target as a version of ``document_embeddings`` with its HNSW index; ``queries`` other
documents of the sample, never published, are the queries. Recall@10 of ``search`` against
``search_exact`` (every vector compared: the truth), and the queries/s of the two, one query
at a time, alternated, best of ``repeats``.

At scale: the same at each of ``sizes`` vectors, with how long the version's index took to
build. Up to the sample's size the vectors are the real ones; beyond it each further vector is
a real one plus gaussian noise with the real vectors' own covariance (``perturbed``), scaled so
that a copy is as close to its source as a real document is to its nearest real neighbour:
noise the same in every dimension would instead scatter the copies into directions no real
document takes, where they are never anyone's neighbour.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
from pydantic import PrivateAttr

from benchmarks.common import Workload, best_alternated, timed
from benchmarks.news_corpus import news_documents, news_vectors
from resources.serving import SqliteTarget

DOCS = "document_embeddings"
DAY = "2026-03-01"
K = 10


class BuildTimedTarget(SqliteTarget):
    """The embedded target, noting how long each version's index took to build (the rest of
    a publish is loading the rows)."""

    _builds: list[float] = PrivateAttr(default_factory=list)

    def ann_payload(self, asset: str, rows: pa.Table) -> bytes | None:
        payload, seconds = timed(lambda: super(BuildTimedTarget, self).ann_payload(asset, rows))
        self._builds.append(seconds)
        return payload

    def last_build_seconds(self) -> float:
        return self._builds[-1]


def embeddings_rows(matrix: np.ndarray) -> pa.Table:
    """``matrix`` as rows of ``document_embeddings`` (doc_id, embedding, model_version)."""
    count, dim = matrix.shape
    return pa.table(
        {
            "doc_id": [f"doc-{n:07d}" for n in range(count)],
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(matrix.ravel()), dim),
            "model_version": ["minilm"] * count,
        }
    )


def search_figures(target: SqliteTarget, asked: np.ndarray, repeats: int) -> dict:
    """Recall@K of ``target.search`` against ``target.search_exact`` over the queries, and
    the best seconds of each for all of them, one query at a time, the two alternated."""
    target.search(DOCS, asked[0])  # the index is read and deserialized once, not timed

    def every(search: Callable) -> list:
        return [search(DOCS, query, K) for query in asked]

    best = best_alternated(
        {"ann": lambda: every(target.search), "exact": lambda: every(target.search_exact)},
        repeats,
    )
    (ann, ann_s), (exact, exact_s) = best["ann"], best["exact"]
    found = sum(
        len({key for key, _ in a} & {key for key, _ in e}) for a, e in zip(ann, exact, strict=True)
    )
    return {"recall": found / (K * len(asked)), "ann_s": ann_s, "exact_s": exact_s, "exact": exact}


def split(matrix: np.ndarray, queries: int) -> tuple[np.ndarray, np.ndarray]:
    """(published, queries): the last ``queries`` documents are held out as the queries."""
    if queries >= len(matrix):
        raise ValueError(f"{queries} held-out queries leave none of {len(matrix)} documents")
    return matrix[: len(matrix) - queries], matrix[len(matrix) - queries :]


def news_search(
    workload: Workload, work: Path, docs: int, queries: int, repeats: int, cache: Path | None
) -> None:
    """The real-news figure (see the module's docstring), added to ``workload``."""
    documents = news_documents()
    if docs + queries > len(documents):
        raise ValueError(
            f"{docs} documents and {queries} queries: the news sample has {len(documents)}"
        )
    chosen = documents[:docs] + documents[len(documents) - queries :]
    published, asked = split(news_vectors(chosen, cache), queries)
    target = SqliteTarget(path=str(work / "serving" / "news.sqlite"))
    version = target.publish(DOCS, embeddings_rows(published), partition=DAY)
    got = search_figures(target, asked, repeats)
    workload.compare(
        "SqliteTarget.search on real news: the version's HNSW index",
        "SqliteTarget.search_exact: cosine against every vector of the version",
        queries / got["ann_s"],
        queries / got["exact_s"],
        "queries/s",
        True,
        note=f"{docs:,} News Category documents (HuffPost headline + lead) x "
        f"{published.shape[1]} dims (the asset's model step), {queries} held-out documents as "
        f"queries, k={K}; recall@10 against exact {got['recall']:.3f}; M={target.hnsw_m}, "
        f"efConstruction={target.ef_construction}, efSearch={target.ef_search}; "
        f"load {version.load_seconds:.2f} s",
    )
    del got["exact"]
    workload.facts["news"] = {"docs": docs, "queries": queries, **got}


def nearest_cosine(matrix: np.ndarray, sample: int = 500, seed: int = 0) -> float:
    """The median cosine between a real document and its nearest other document."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(matrix), min(sample, len(matrix)), replace=False)
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    scores = unit[rows] @ unit.T
    scores[np.arange(len(rows)), rows] = -np.inf
    return float(np.median(scores.max(axis=1)))


def perturbed(base: np.ndarray, count: int, cosine: float, seed: int = 0) -> np.ndarray:
    """``count`` vectors: ``base`` itself, then copies of its rows in turn plus gaussian noise
    drawn with ``base``'s own covariance (so a copy varies along the directions real documents
    vary along), its norm putting each copy at about ``cosine`` from its (unit) source."""
    if count <= len(base):
        return base[:count]
    rng = np.random.default_rng(seed)
    unit = base / np.linalg.norm(base, axis=1, keepdims=True)
    _, spread, directions = np.linalg.svd(unit - unit.mean(axis=0), full_matrices=False)
    shape = (spread[:, None] / np.sqrt(len(unit))) * directions  # z @ shape ~ N(0, covariance)
    extra = count - len(base)
    noise = rng.standard_normal((extra, len(spread)), dtype=np.float32) @ shape
    noise *= np.sqrt(1.0 / cosine**2 - 1.0) / np.sqrt((spread**2).sum() / len(unit))
    copies = unit[np.arange(extra) % len(base)] + noise
    copies /= np.linalg.norm(copies, axis=1, keepdims=True)
    return np.concatenate([base, copies.astype(np.float32)])


def scale_sweep(
    workload: Workload,
    work: Path,
    sizes: Sequence[int],
    queries: int,
    repeats: int,
    cache: Path | None,
    settings: Sequence[tuple[int, int, int]],
) -> None:
    """The index at scale (see the module's docstring): for each size and each (M,
    efConstruction, efSearch) of ``settings``, the build time, recall@10 and queries/s of
    ``search`` against ``search_exact``, added to ``workload``."""
    base, asked = split(news_vectors(news_documents(), cache), queries)
    cosine = nearest_cosine(base)
    workload.facts["scale"] = {"nearest_cosine": cosine, "real": len(base), "runs": []}
    for size in sizes:
        matrix = perturbed(base, size, cosine)
        rows = embeddings_rows(matrix)
        built: dict[tuple[int, int], tuple[BuildTimedTarget, float, float]] = {}
        for m, ef_construction, ef_search in settings:
            if (m, ef_construction) not in built:
                target = BuildTimedTarget(
                    path=str(work / "serving" / f"scale-{size}-{m}-{ef_construction}.sqlite"),
                    hnsw_m=m,
                    ef_construction=ef_construction,
                    keep_versions=1,
                )
                version = target.publish(DOCS, rows, partition=DAY)
                built[m, ef_construction] = (
                    target,
                    target.last_build_seconds(),
                    version.load_seconds,
                )
            first, build_s, load_s = built[m, ef_construction]
            # Same file, same version: the index built once is searched with another efSearch.
            target = SqliteTarget(
                path=first.path, hnsw_m=m, ef_construction=ef_construction, ef_search=ef_search
            )
            got = search_figures(target, asked, repeats)
            made = "real"
            if size > len(base):
                truth = [
                    int(key.removeprefix("doc-")) for found in got["exact"] for key, _ in found
                ]
                copies = np.mean(np.array(truth) >= len(base))
                made = (
                    f"{len(base):,} real + perturbed copies; copies are {copies:.1%} of the exact "
                    "top-10s"
                )
            del got["exact"]
            workload.compare(
                f"search at {size:,} vectors, M={m}, efConstruction={ef_construction}, "
                f"efSearch={ef_search}",
                "search_exact at the same size",
                queries / got["ann_s"],
                queries / got["exact_s"],
                "queries/s",
                True,
                note=f"{size:,} vectors ({made}), {queries} held-out news queries, k={K}; "
                f"recall@10 {got['recall']:.3f}; index built in {build_s:.1f} s of a "
                f"{load_s:.1f} s publish",
            )
            workload.facts["scale"]["runs"].append(
                {
                    "size": size,
                    "m": m,
                    "ef_construction": ef_construction,
                    "ef_search": ef_search,
                    "build_s": build_s,
                    "load_s": load_s,
                    **got,
                }
            )
