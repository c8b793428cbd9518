"""Reading interaction history out of landing storage as column arrays, batch by batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from assets.recommendations.schemas import INTERACTIONS, INTERACTIONS_SCHEMA
from inference.recommend import Vocabulary
from resources.storage import DataStore, LandingDataError


@dataclass(frozen=True)
class Interactions:
    """Interaction columns as arrays: who, what, and how strongly."""

    user_ids: np.ndarray
    item_ids: np.ndarray
    weights: np.ndarray

    def __len__(self) -> int:
        return len(self.user_ids)

    @property
    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        return self.user_ids, self.item_ids

    @property
    def triples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.user_ids, self.item_ids, self.weights


def read_interactions(
    store: DataStore, dates: list[str], users: np.ndarray | None = None
) -> Interactions:
    """All interactions of the given days, optionally only those of ``users``.

    Streams record batches and keeps three numeric columns, so a day's rows are never held
    as a table; filtering by user while streaming keeps a scoring run's memory proportional
    to the day's active users, not to the whole history.
    """
    keep = None if users is None else pa.array(users, pa.int64())
    parts: list[Interactions] = []
    for date in dates:
        for batch in store.iter_landing(
            INTERACTIONS, date, INTERACTIONS_SCHEMA, columns=["user_id", "item_id", "weight"]
        ):
            _refuse_nulls(batch, store, date)
            if keep is not None:
                batch = batch.filter(pc.is_in(batch.column("user_id"), value_set=keep))
            parts.append(
                Interactions(
                    batch.column("user_id").to_numpy(zero_copy_only=False),
                    batch.column("item_id").to_numpy(zero_copy_only=False),
                    batch.column("weight").to_numpy(zero_copy_only=False),
                )
            )
    return Interactions(
        np.concatenate([p.user_ids for p in parts] or [np.zeros(0, np.int64)]),
        np.concatenate([p.item_ids for p in parts] or [np.zeros(0, np.int64)]),
        np.concatenate([p.weights for p in parts] or [np.zeros(0, np.float32)]),
    )


@dataclass(frozen=True)
class DayActivity:
    """Who was active on a day, and how much of it the model cannot know about."""

    users: np.ndarray  # unique user ids
    rows: int
    unknown_items: int  # distinct items the model's catalogue lacks
    unknown_item_interactions: int


def read_day(store: DataStore, date: str, catalogue: Vocabulary) -> DayActivity:
    """The active users of one day, streaming the partition two columns at a time."""
    users: list[np.ndarray] = []
    unknown: list[np.ndarray] = []
    rows = 0
    for batch in store.iter_landing(
        INTERACTIONS, date, INTERACTIONS_SCHEMA, columns=["user_id", "item_id"]
    ):
        _refuse_nulls(batch, store, date)
        users.append(np.unique(batch.column("user_id").to_numpy(zero_copy_only=False)))
        items = batch.column("item_id").to_numpy(zero_copy_only=False)
        unknown.append(items[catalogue.index(items) < 0])
        rows += batch.num_rows
    unknown_all = np.concatenate(unknown or [np.zeros(0, np.int64)])
    return DayActivity(
        users=np.unique(np.concatenate(users or [np.zeros(0, np.int64)])),
        rows=rows,
        unknown_items=len(np.unique(unknown_all)),
        unknown_item_interactions=len(unknown_all),
    )


def _refuse_nulls(batch: pa.RecordBatch, store: DataStore, date: str) -> None:
    # A null id would become NaN in numpy and quietly match nothing; say where it is instead.
    for column in batch.schema.names:
        if batch.column(column).null_count:
            where = store.uri(store.landing_path(INTERACTIONS, date))
            raise LandingDataError(
                f"dataset '{INTERACTIONS}', date {date}: column '{column}' has "
                f"{batch.column(column).null_count} null values in {where}"
            )
