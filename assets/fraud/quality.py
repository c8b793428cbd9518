"""Fraud data quality over a DataStore: one day's transactions streamed from landing through
the screening rules (``inference/fraud/screening.py``), and the plan kept for scoring.

One screening pass over a landing partition (the columns the model needs) finds the rows that
cannot be scored, each with a reason, and builds the feature profile from the clean rows only.
While the clean rows stream through the model, ``inference/fraud/score_figures.py`` keeps exact
statistics of the scores.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from assets.fraud.schemas import AMOUNT_CEILING, TRANSACTIONS, TRANSACTIONS_SCHEMA
from assets.gates import day_bounds, empty_landing_error
from inference.engine.batching import prefetch
from inference.engine.quarantine import QuarantinePlan
from inference.fraud.features import PROFILE_COLUMNS
from inference.fraud.screening import (
    SCREEN_COLUMNS,
    TransactionScreen,
    TransactionScreener,
    screen_rules,
)
from resources.quality import PositionCursor, sample_positions
from resources.storage import DataStore

# The screening pass reads bigger batches than the model takes: its per-batch costs (Arrow
# hashing the accounts seen so far, one sort per batch) shrink with fewer batches, while a
# batch of this size stays a few tens of MB.
SCREEN_BATCH_ROWS = 262_144


def screen_transactions(
    store: DataStore,
    date: str,
    *,
    build_profile: bool = False,
    sample_rows: int = 0,
    seed: int = 0,
    plan: QuarantinePlan | None = None,
    amount_ceiling: float = AMOUNT_CEILING,
) -> TransactionScreen:
    """Screens one landing partition: quarantine plan, exact figures, a seeded row sample.

    Args:
        store: the data store.
        date: the partition.
        build_profile: aggregate the feature profile of the clean rows on the way (see
            :meth:`TransactionScreen.profile`).
        sample_rows: size of the seeded random sample of landing rows (for row-level checks).
        seed: the sample's seed.
        plan: the plan the landing checks already made for these exact files (see
            :func:`load_screen`): only the profile is built, from the five columns it needs,
            and the figures are left empty.
        amount_ceiling: the contract's largest amount; a larger one is quarantined.

    Raises:
        LandingDataError: the partition is missing, unreadable, malformed or empty.
    """
    day = day_bounds(date, TRANSACTIONS_SCHEMA.field("ts").type)
    rows = store.count_landing(TRANSACTIONS, date, TRANSACTIONS_SCHEMA)
    if rows == 0:
        raise empty_landing_error(store, TRANSACTIONS, date)

    def stream(columns: list[str]):
        # The next batch is read and decoded in the background while this one is screened.
        batches = store.iter_landing(
            TRANSACTIONS, date, TRANSACTIONS_SCHEMA, columns, batch_size=SCREEN_BATCH_ROWS
        )
        return prefetch(batches, depth=1)

    def rows_at(positions: np.ndarray) -> pa.RecordBatch:
        # The profile columns of a few rows read again: duplicates are known only once the
        # whole day was screened, and then leave the profile.
        cursor, taken = PositionCursor(positions), []
        for batch in stream(PROFILE_COLUMNS):
            taken.append(batch.take(pa.array(cursor.advance(batch.num_rows))))
        return pa.Table.from_batches(taken).combine_chunks().to_batches()[0]

    if plan is not None:
        return TransactionScreen.kept(plan, rows, stream(PROFILE_COLUMNS))
    sampler = PositionCursor(sample_positions(rows, sample_rows, seed))
    screener = TransactionScreener(
        rows,
        lambda: pa.chunked_array(b.column(0) for b in stream(["transaction_id"])),
        day,
        amount_ceiling,
        build_profile,
    )
    sampled = []
    for batch in stream(SCREEN_COLUMNS):
        screener.add(batch)
        local = sampler.advance(batch.num_rows)
        if len(local):
            sampled.append(batch.take(pa.array(local)))
    sample = pa.Table.from_batches(sampled, schema=_schema(SCREEN_COLUMNS))
    return screener.finish(sample, rows_at)


def save_screen(
    store: DataStore, date: str, screen: TransactionScreen, amount_ceiling: float = AMOUNT_CEILING
) -> str:
    """Keeps the landing checks' quarantine plan for scoring, tied to the files it was made from
    (the day's ``transaction_screens`` partition); returns where it went.

    ``fraud_scores`` then builds its feature profile from five columns instead of screening
    the day again.
    """
    return store.keep_screen(TRANSACTIONS, date, screen.plan, screen_rules(amount_ceiling))


def load_screen(
    store: DataStore, date: str, amount_ceiling: float = AMOUNT_CEILING
) -> QuarantinePlan | None:
    """The kept plan, if it was made by these rules and limits from exactly the files landed
    now."""
    landed = store.landing_read(TRANSACTIONS, date, kept=True)
    return landed.screened(screen_rules(amount_ceiling))


def _schema(columns: list[str]) -> pa.Schema:
    return pa.schema([TRANSACTIONS_SCHEMA.field(c) for c in columns])
