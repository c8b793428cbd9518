"""Which interactions are history: the rules over a record batch, and the arrays kept of them.

A row with an unknown event type or a weight that is null, not finite or negative is not
history (:func:`unusable_rules`). The landing screen quarantines those rows with their reason
(:func:`quarantined_rows`) and every reader of the history skips them (:func:`usable`), so
training, the audience and the seen items never count them. Reading the rows out of storage is
the recommendations assets' own; no Dagster and no data access here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inference.engine.quarantine import (
    REASON,
    ROW_NUMBER,
    SOURCE_FILE,
    SOURCE_ROW_NUMBER,
    QuarantinePlan,
    below,
    is_null,
    not_finite,
)

EVENT_TYPES = ("view", "click", "purchase")
# Why an interaction cannot be used, in priority order: a row gets the first reason that holds.
QUARANTINE_REASONS = ("unknown_event", "non_finite_weight", "negative_weight")
RULE_COLUMNS = ["event", "weight"]
_EVENTS = pa.array(EVENT_TYPES, pa.string())


def unusable_rules(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """One boolean mask per quarantine reason over a batch holding ``event`` and ``weight``."""
    weight = batch.column("weight")
    known = pc.is_in(batch.column("event"), value_set=_EVENTS)
    return {
        "unknown_event": pc.fill_null(pc.invert(known), True).to_numpy(zero_copy_only=False),
        "non_finite_weight": not_finite(weight) | is_null(weight),
        "negative_weight": below(weight, 0.0),
    }


def usable(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch without the rows :func:`unusable_rules` quarantines."""
    bad = np.logical_or.reduce(list(unusable_rules(batch).values()))
    return batch.filter(pa.array(~bad)) if bad.any() else batch


def quarantined_rows(
    batch: pa.RecordBatch,
    flagged: np.ndarray,
    rules: dict[str, np.ndarray],
    offset: int,
    source: tuple[str, int],
    schema: pa.Schema,
) -> pa.Table:
    """The flagged rows of a batch with their position in the partition, first reason, and
    file and row there (``source``: the batch's file and its first row's position in it).

    Args:
        batch: a batch of landed interactions.
        flagged: the rows of the batch that cannot be used.
        rules: the batch's masks per reason, in priority order (see :func:`unusable_rules`).
        offset: the batch's first row's position in the partition.
        source: the batch's file and its first row's position in that file.
        schema: the landed interactions' schema, which the rows keep.
    """
    local = np.flatnonzero(flagged)
    reasons = np.empty(len(local), object)
    taken = np.zeros(len(local), bool)
    for reason, mask in rules.items():
        new = mask[local] & ~taken
        reasons[new] = reason
        taken |= new
    table = pa.Table.from_batches([batch.take(pa.array(local))]).cast(schema)
    table = table.append_column(ROW_NUMBER, pa.array(local + offset, pa.int64()))
    table = table.append_column(REASON, pa.array(reasons.tolist(), pa.string()))
    table = table.append_column(SOURCE_FILE, pa.repeat(pa.scalar(source[0]), len(local)))
    return table.append_column(SOURCE_ROW_NUMBER, pa.array(local + source[1], pa.int64()))


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


@dataclass(frozen=True)
class DayActivity:
    """Who was active on a day, which rows could not be used, and how much of the rest the
    model cannot know about."""

    users: np.ndarray  # unique ids of users with a usable interaction
    rows: int  # every landed row
    plan: QuarantinePlan  # the rows not used, each with its reason
    unknown_items: int  # distinct items (of usable rows) the model's catalogue lacks
    unknown_item_interactions: int

    @property
    def rows_used(self) -> int:
        return self.rows - self.plan.count

    @property
    def unknown_item_share(self) -> float:
        """Share of the usable interactions whose item the model does not know."""
        return self.unknown_item_interactions / self.rows_used if self.rows_used else 0.0
