"""The fraud screening rules: which transactions cannot be scored, and why.

A day's transactions stream through a :class:`TransactionScreener` one record batch at a time;
each row that breaks a rule (a required field null, an amount not finite, negative or above the
contract's ceiling, a time outside the day, an id seen before) gets the first reason it breaks.
The clean rows build the feature profile on the way, so a duplicate or a malformed row never
skews another transaction's features. Where the batches come from is the caller's business:
no store is read here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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

SCREEN_COLUMNS = ["transaction_id", *FEATURE_COLUMNS]
# Currency is carried to alerts but not scored: a missing one is no reason to skip a transaction.
REQUIRED = ["transaction_id", "account_id", "merchant_id", "amount", "ts", "channel", "country"]
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

# Bumped whenever the screening rules change, so a plan kept under older rules is not reused.
SCREEN_RULES_VERSION = 2


def screen_rules(amount_ceiling: float) -> dict[str, Any]:
    """What decides a screening besides the files: the rules' version and the contract's
    ceiling. A plan kept under others is not reused."""
    return {"version": SCREEN_RULES_VERSION, "amount_ceiling": float(amount_ceiling)}


@dataclass
class TransactionScreen:
    """What the screening pass found in one day of transactions."""

    plan: QuarantinePlan
    figures: dict[str, Any]
    sample: pa.Table
    builder: ProfileBuilder | None = None

    @classmethod
    def kept(
        cls, plan: QuarantinePlan, rows: int, batches: Iterable[pa.RecordBatch]
    ) -> TransactionScreen:
        """The screening of a plan kept for these exact rows: only the profile is built, from
        the clean rows of ``batches`` (the profile columns, in input order); the figures and
        the sample are left empty."""
        builder, offset = ProfileBuilder(rows, overlap=True), 0
        for batch in batches:
            builder.add(plan.split(batch, offset)[0])
            offset += batch.num_rows
        return cls(plan, {}, pa.table({}), builder)

    def profile(self) -> PartitionProfile:
        """The feature profile over the rows that will be scored: quarantined rows never count.

        Aggregated while the screening pass streamed (memory follows accounts and merchants,
        plus 8 bytes per row, never the rows' strings) and finished on demand, after the
        quarantine rate was checked, so a day that is mostly bad fails with the rate rather
        than with an empty profile.
        """
        assert self.builder is not None, "screen_transactions(build_profile=True) builds it"
        return self.builder.finish()


class TransactionScreener:
    """The rules applied to one day's transactions, a record batch of :data:`SCREEN_COLUMNS`
    at a time, in input order; :meth:`finish` makes the day's quarantine plan and figures."""

    def __init__(
        self,
        rows: int,
        ids: Callable[[], pa.ChunkedArray],
        day: tuple[pa.Scalar, pa.Scalar],
        amount_ceiling: float,
        build_profile: bool = False,
    ) -> None:
        """
        Args:
            rows: the day's transactions.
            ids: reads the day's transaction ids again, in input order, when duplicates must
                be found exactly (see :class:`~inference.engine.quarantine.Screener`).
            day: the first instant of the day and the first one after it.
            amount_ceiling: the contract's largest amount; a larger one is quarantined.
            build_profile: aggregate the feature profile of the clean rows on the way.
        """
        self.rows = rows
        self.start, self.end = day
        self.amount_ceiling = amount_ceiling
        self.screener = Screener(ids)
        self.builder = ProfileBuilder(rows, overlap=True) if build_profile else None
        self.amount_low, self.amount_high = np.inf, -np.inf

    def add(self, batch: pa.RecordBatch) -> None:
        """Screens the next batch and adds its clean rows to the profile."""
        amount = batch["amount"]
        rules = {f"null_{c}": is_null(batch[c]) for c in REQUIRED}
        rules["non_finite_amount"] = not_finite(amount)
        rules["negative_amount"] = below(amount, 0.0)
        rules["amount_above_ceiling"] = above(amount, self.amount_ceiling)
        rules["ts_outside_day"] = outside(batch["ts"], self.start, self.end)
        flagged = self.screener.add(batch.num_rows, rules)
        self.screener.keys(batch["transaction_id"], "duplicate_transaction_id")
        extremes = pc.min_max(amount).as_py()
        if extremes["min"] is not None:
            self.amount_low = min(self.amount_low, extremes["min"])
            self.amount_high = max(self.amount_high, extremes["max"])
        if self.builder is not None:
            clean = batch.select(PROFILE_COLUMNS)
            self.builder.add(clean.filter(pa.array(~flagged)) if flagged.any() else clean)

    def finish(
        self, sample: pa.Table, rows_at: Callable[[np.ndarray], pa.RecordBatch]
    ) -> TransactionScreen:
        """The day's screening once every batch was added.

        Args:
            sample: the seeded sample of landing rows the row-level checks read.
            rows_at: the profile columns of the rows at some positions, read again: the
                duplicates, known only now, leave the profile again (they are few).
        """
        plan = self.screener.plan()
        if self.builder is not None:
            repeated = plan.positions[plan.reasons == "duplicate_transaction_id"]
            if len(repeated):
                self.builder.remove(rows_at(repeated))
        figures: dict[str, Any] = {
            "rows": self.rows,
            "rows_quarantined": plan.count,
            "quarantine_rate": plan.rate,
            **dict.fromkeys(REASONS, 0),
            **plan.counts(),
            "amount_min": float(self.amount_low) if np.isfinite(self.amount_low) else 0.0,
            "amount_max": float(self.amount_high) if np.isfinite(self.amount_high) else 0.0,
        }
        return TransactionScreen(plan, figures, sample, self.builder)
