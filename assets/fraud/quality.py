"""Fraud data quality as plain functions: which transactions cannot be scored.

One screening pass over a landing partition (the columns the model needs) finds the rows that
cannot be scored, each with a reason, and builds the feature profile from the clean rows only,
so a duplicate or a malformed row never skews another transaction's features. While the clean
rows stream through the model, ``inference/fraud/score_figures.py`` keeps exact statistics of
the scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from assets.fraud.schemas import AMOUNT_CEILING, TRANSACTIONS, TRANSACTIONS_SCHEMA
from assets.gates import day_bounds, empty_landing_error
from inference.engine.batching import prefetch
from inference.engine.quarantine import (
    QuarantinePlan,
    Screener,
    above,
    below,
    is_null,
    not_finite,
    outside,
)
from inference.fraud.features import (
    FEATURE_COLUMNS,
    PROFILE_COLUMNS,
    PartitionProfile,
    ProfileBuilder,
)
from resources.quality import PositionCursor, sample_positions
from resources.storage import DataStore

SCREEN_COLUMNS = ["transaction_id", *FEATURE_COLUMNS]
# Currency is carried to alerts but not scored: a missing one is no reason to skip a transaction.
REQUIRED = ["transaction_id", "account_id", "merchant_id", "amount", "ts", "channel", "country"]
# The screening pass reads bigger batches than the model takes: its per-batch costs (Arrow
# hashing the accounts seen so far, one sort per batch) shrink with fewer batches, while a
# batch of this size stays a few tens of MB.
SCREEN_BATCH_ROWS = 262_144
REASONS = (
    *(f"null_{c}" for c in REQUIRED),
    "non_finite_amount",
    "negative_amount",
    "amount_above_ceiling",
    "ts_outside_day",
    "duplicate_transaction_id",
)
# Which landing check each quarantine reason belongs to (shown as counts in its metadata).
QUARANTINED_REASONS = {
    "transaction_ids_present_and_unique": ("null_transaction_id", "duplicate_transaction_id"),
    "transaction_values_in_range": tuple(
        r for r in REASONS if r not in ("null_transaction_id", "duplicate_transaction_id")
    ),
}


@dataclass
class TransactionScreen:
    """What the screening pass found in one day of transactions."""

    plan: QuarantinePlan
    figures: dict[str, Any]
    sample: pa.Table
    builder: ProfileBuilder | None = None

    def profile(self) -> PartitionProfile:
        """The feature profile over the rows that will be scored: quarantined rows never count.

        Aggregated while the screening pass streamed (memory follows accounts and merchants,
        plus 8 bytes per row, never the rows' strings) and finished on demand, after the
        quarantine rate was checked, so a day that is mostly bad fails with the rate rather
        than with an empty profile.
        """
        assert self.builder is not None, "screen_transactions(build_profile=True) builds it"
        return self.builder.finish()


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
    start, end = day_bounds(date, TRANSACTIONS_SCHEMA.field("ts").type)
    rows = store.count_landing(TRANSACTIONS, date, TRANSACTIONS_SCHEMA)
    if rows == 0:
        raise empty_landing_error(store, TRANSACTIONS, date)

    def stream(columns: list[str]):
        # The next batch is read and decoded in the background while this one is screened.
        batches = store.iter_landing(
            TRANSACTIONS, date, TRANSACTIONS_SCHEMA, columns, batch_size=SCREEN_BATCH_ROWS
        )
        return prefetch(batches, depth=1)

    if plan is not None:
        builder, offset = ProfileBuilder(rows, overlap=True), 0
        for batch in stream(PROFILE_COLUMNS):
            builder.add(plan.split(batch, offset)[0])
            offset += batch.num_rows
        return TransactionScreen(plan, {}, pa.table({}), builder)
    sampler = PositionCursor(sample_positions(rows, sample_rows, seed))
    screener = Screener(lambda: pa.chunked_array(b.column(0) for b in stream(["transaction_id"])))
    builder = ProfileBuilder(rows, overlap=True) if build_profile else None
    sampled = []
    amount_low, amount_high = np.inf, -np.inf
    for batch in stream(SCREEN_COLUMNS):
        amount = batch["amount"]
        rules = {f"null_{c}": is_null(batch[c]) for c in REQUIRED}
        rules["non_finite_amount"] = not_finite(amount)
        rules["negative_amount"] = below(amount, 0.0)
        rules["amount_above_ceiling"] = above(amount, amount_ceiling)
        rules["ts_outside_day"] = outside(batch["ts"], start, end)
        flagged = screener.add(batch.num_rows, rules)
        screener.keys(batch["transaction_id"], "duplicate_transaction_id")
        extremes = pc.min_max(amount).as_py()
        if extremes["min"] is not None:
            amount_low = min(amount_low, extremes["min"])
            amount_high = max(amount_high, extremes["max"])
        if builder is not None:
            clean = batch.select(PROFILE_COLUMNS)
            builder.add(clean.filter(pa.array(~flagged)) if flagged.any() else clean)
        local = sampler.advance(batch.num_rows)
        if len(local):
            sampled.append(batch.take(pa.array(local)))
    plan = screener.plan()
    if builder is not None:
        # Duplicates are known only now: take their rows (few) out of the profile again.
        repeated = plan.positions[plan.reasons == "duplicate_transaction_id"]
        if len(repeated):
            cursor, taken = PositionCursor(repeated), []
            for batch in stream(PROFILE_COLUMNS):
                taken.append(batch.take(pa.array(cursor.advance(batch.num_rows))))
            builder.remove(pa.Table.from_batches(taken).combine_chunks().to_batches()[0])
    figures: dict[str, Any] = {
        "rows": rows,
        "rows_quarantined": plan.count,
        "quarantine_rate": plan.rate,
        **dict.fromkeys(REASONS, 0),
        **plan.counts(),
        "amount_min": float(amount_low) if np.isfinite(amount_low) else 0.0,
        "amount_max": float(amount_high) if np.isfinite(amount_high) else 0.0,
    }
    sample = pa.Table.from_batches(sampled, schema=_schema(SCREEN_COLUMNS))
    return TransactionScreen(plan, figures, sample, builder)


# Bumped whenever the screening rules change, so a plan kept under older rules is not reused.
SCREEN_RULES_VERSION = 2


def screen_rules(amount_ceiling: float = AMOUNT_CEILING) -> dict[str, Any]:
    """What decides a screening besides the files: the rules' version and the contract's
    ceiling. A plan kept under others is not reused."""
    return {"version": SCREEN_RULES_VERSION, "amount_ceiling": float(amount_ceiling)}


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
