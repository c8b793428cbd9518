"""A day of served recommendations (or embeddings) the serving tests load, and what the
readers' query answers for it: a module without Dagster or torch, which the loader processes
import quickly."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

USERS, RANKS = 2_000, 10


def day(model: str, users: int = USERS, shift: int = 0) -> pa.Table:
    """A day of recommendations: every user ``RANKS`` items, all scored by ``model``."""
    user = [u for u in range(users) for _ in range(RANKS)]
    rank = [r for _ in range(users) for r in range(1, RANKS + 1)]
    return pa.table(
        {
            "user_id": pa.array(user, pa.int64()),
            "rank": pa.array(rank, pa.int16()),
            "item_id": pa.array(
                [u * 100 + r + shift for u, r in zip(user, rank, strict=True)], pa.int64()
            ),
            "score": pa.array([1.0 / r for r in rank], pa.float32()),
            "model_version": [model] * len(user),
        }
    )


def seen(table: pa.Table) -> list:
    """What the readers' query returns for a day (see READER)."""
    return [
        table.num_rows,
        len(set(table["user_id"].to_pylist())),
        min(table["model_version"].to_pylist()),
        max(table["model_version"].to_pylist()),
        sum(table["item_id"].to_pylist()),
    ]


def vectors_day(docs: int, seed: int, dim: int = 64) -> tuple[pa.Table, np.ndarray]:
    """A day of ``document_embeddings`` rows with random unit vectors, and the vectors."""
    rng = np.random.default_rng(seed)
    matrix = rng.standard_normal((docs, dim)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return embeddings_day([f"doc-{seed}-{i:04d}" for i in range(docs)], matrix), matrix


def embeddings_day(ids: list[str], matrix: np.ndarray, model: str = "m") -> pa.Table:
    dim = matrix.shape[1]
    return pa.table(
        {
            "doc_id": ids,
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(matrix.ravel()), dim),
            "model_version": [model] * len(ids),
        }
    )


def recall_at(target, asset: str, queries: np.ndarray, k: int = 10) -> float:
    """The share of the exact ``k`` nearest (``search_exact``) that ``search`` finds."""
    found = 0
    for query in queries:
        exact = {key for key, _ in target.search_exact(asset, query, k)}
        found += len(exact & {key for key, _ in target.search(asset, query, k)})
    return found / (k * len(queries))
