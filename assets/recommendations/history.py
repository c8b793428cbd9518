"""Reading interaction history out of landing storage as column arrays, batch by batch.

Every reader applies the same rules (``inference/recs/history.py``): a row with an unknown event
type or a weight that is null, not finite or negative is not history. The ``interactions`` asset
publishes those rows with their reason to ``interactions_quarantine``; here they are skipped,
so training, the audience and the seen items never count them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from assets.recommendations.schemas import INTERACTIONS, INTERACTIONS_SCHEMA
from inference.engine.quarantine import QuarantinePlan, Screener
from inference.recs.history import (
    RULE_COLUMNS,
    DayActivity,
    Interactions,
    unusable_rules,
    usable,
)
from inference.recs.sparse import Vocabulary
from resources.storage import DataStore, LandingDataError


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
    columns = ["user_id", "item_id", *RULE_COLUMNS]
    for date in dates:
        for batch in store.iter_landing(INTERACTIONS, date, INTERACTIONS_SCHEMA, columns=columns):
            _refuse_nulls(batch, store, date)
            batch = usable(batch)
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


def read_day(store: DataStore, date: str, catalogue: Vocabulary) -> DayActivity:
    """The active users of one day, streaming the partition four columns at a time."""
    users: list[np.ndarray] = []
    unknown: list[np.ndarray] = []
    screener = Screener()
    columns = ["user_id", "item_id", *RULE_COLUMNS]
    for batch in store.iter_landing(INTERACTIONS, date, INTERACTIONS_SCHEMA, columns=columns):
        _refuse_nulls(batch, store, date)
        bad = screener.add(batch.num_rows, unusable_rules(batch))
        batch = batch.filter(pa.array(~bad)) if bad.any() else batch
        users.append(np.unique(batch.column("user_id").to_numpy(zero_copy_only=False)))
        items = batch.column("item_id").to_numpy(zero_copy_only=False)
        unknown.append(items[catalogue.index(items) < 0])
    unknown_all = np.concatenate(unknown or [np.zeros(0, np.int64)])
    return DayActivity(
        users=np.unique(np.concatenate(users or [np.zeros(0, np.int64)])),
        rows=screener.rows,
        plan=screener.plan(),
        unknown_items=len(np.unique(unknown_all)),
        unknown_item_interactions=len(unknown_all),
    )


def unusable_plan(store: DataStore, date: str) -> QuarantinePlan:
    """A landed day's rows that are not history, each with its reason (as :func:`read_day`
    screens them), reading only the columns the rules need."""
    screener = Screener()
    for batch in store.iter_landing(INTERACTIONS, date, INTERACTIONS_SCHEMA, columns=RULE_COLUMNS):
        screener.add(batch.num_rows, unusable_rules(batch))
    return screener.plan()


def read_users(store: DataStore, dates: list[str]) -> np.ndarray:
    """Sorted unique ids of the users with a usable interaction on any of ``dates``."""
    found: list[np.ndarray] = []
    for date in dates:
        for batch in store.iter_landing(
            INTERACTIONS, date, INTERACTIONS_SCHEMA, columns=["user_id", *RULE_COLUMNS]
        ):
            _refuse_nulls(batch, store, date)
            found.append(np.unique(usable(batch).column("user_id").to_numpy(zero_copy_only=False)))
    return np.unique(np.concatenate(found or [np.zeros(0, np.int64)]))


def _refuse_nulls(batch: pa.RecordBatch, store: DataStore, date: str) -> None:
    # A null id would become NaN in numpy and quietly match nothing; say where it is instead.
    # (A null event or weight is a quarantine reason, not an error.)
    for column in ("user_id", "item_id"):
        if column not in batch.schema.names:
            continue
        if batch.column(column).null_count:
            where = store.uri(store.landing_path(INTERACTIONS, date))
            raise LandingDataError(
                f"dataset '{INTERACTIONS}', date {date}: column '{column}' has "
                f"{batch.column(column).null_count} null values in {where}"
            )
