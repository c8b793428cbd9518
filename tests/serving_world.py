"""A day of served recommendations the serving tests load, and what the readers' query
answers for it: a module without Dagster or torch, which the loader processes import quickly."""

from __future__ import annotations

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
