"""Recommendations data quality: the screening pass over a landed day of interactions (which
rows cannot be used, and why), streaming its batches through the rules of
``inference/recs/history.py``. Which users cannot be given recommendations, and the exact
figures of the published lists, are the lists' own (``inference/recs/lists.py``).

An interaction with an unknown event type or a weight that is null, not finite or negative is
quarantined with its reason, as fraud quarantines a transaction: ``interactions`` publishes
those rows to ``interactions_quarantine`` and every reader of the history skips them, so
``rows = rows used + rows quarantined`` for each day. One with a null id cannot be attributed
to anyone, so it fails the day naming the file and column. The rows scored are the audience's
users; a user who has already interacted with every item in the catalogue has nothing left to
recommend and is quarantined (``no_unseen_items``) instead of vanishing from the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from assets.gates import day_bounds, landed_rows
from assets.recommendations.schemas import INTERACTIONS, INTERACTIONS_SCHEMA
from inference.engine.quarantine import (
    REASON,
    ROW_NUMBER,
    SOURCE_FILE,
    SOURCE_ROW_NUMBER,
    QuarantineLimit,
    QuarantinePlan,
    Screener,
    is_null,
    outside,
)
from inference.recs.history import QUARANTINE_REASONS, quarantined_rows, unusable_rules
from resources.quality import PositionCursor, sample_positions
from resources.storage import DataStore, LandingDataError

INTERACTIONS_QUARANTINE = f"{INTERACTIONS}_quarantine"
# A quarantined interaction: its columns, its row across the day, why, and where it is.
QUARANTINE_SCHEMA = pa.schema(
    [
        *INTERACTIONS_SCHEMA,
        pa.field(ROW_NUMBER, pa.int64()),
        pa.field(REASON, pa.string()),
        pa.field(SOURCE_FILE, pa.string()),
        pa.field(SOURCE_ROW_NUMBER, pa.int64()),
    ]
)


@dataclass
class InteractionScreen:
    """What the screening pass found in one day of interactions."""

    plan: QuarantinePlan
    figures: dict[str, Any]
    sample: pa.Table
    # The quarantined rows with row_number and reason; None when more were found than may be
    # quarantined (the day fails, and they are not held in memory).
    quarantined: pa.Table | None = None


def screen_interactions(
    store: DataStore,
    date: str,
    sample_rows: int = 0,
    seed: int = 0,
    max_rate: QuarantineLimit | float = 1.0,
) -> InteractionScreen:
    """Finds the rows of one day of interactions that cannot be used, counts them by reason,
    and samples the rows.

    Args:
        store: the data store.
        date: the partition.
        sample_rows: size of the seeded random sample of landing rows.
        seed: the sample's seed.
        max_rate: the quarantine limit; above it the quarantined rows are counted, not kept.

    Raises:
        LandingDataError: the partition is missing, unreadable, malformed or empty, or a row
            has no user or item id (naming the file and the column).
    """
    day = day_bounds(date, INTERACTIONS_SCHEMA.field("ts").type)
    rows = landed_rows(store, INTERACTIONS, date, INTERACTIONS_SCHEMA)
    sampler = PositionCursor(sample_positions(rows, sample_rows, seed))
    keep_at_most = int(QuarantineLimit.of(max_rate).allowed(rows))
    screener, sampled, held = Screener(), [], []
    outside_day = used = 0
    in_file: dict[str, int] = {}  # rows read so far from each file
    for file, batch in store.iter_landing_files(INTERACTIONS, date, INTERACTIONS_SCHEMA):
        for column in ("user_id", "item_id"):
            if batch[column].null_count:
                raise LandingDataError(
                    f"{store.uri(file)} (dataset '{INTERACTIONS}', date {date}): column "
                    f"'{column}' has {batch[column].null_count} null values; an interaction "
                    "without it cannot be attributed"
                )
        offset, source = screener.rows, (store.uri(file), in_file.get(file, 0))
        in_file[file] = source[1] + batch.num_rows
        rules = unusable_rules(batch)
        flagged = screener.add(batch.num_rows, rules)
        used += int((~flagged).sum())
        # Early or late events still count as history: counted for a WARN, not quarantined.
        outside_day += int((outside(batch["ts"], *day) | is_null(batch["ts"])).sum())
        if flagged.any() and held is not None:
            held.append(
                quarantined_rows(batch, flagged, rules, offset, source, INTERACTIONS_SCHEMA)
            )
            if sum(t.num_rows for t in held) > keep_at_most:
                held = None
        local = sampler.advance(batch.num_rows)
        if len(local):
            sampled.append(batch.take(pa.array(local)))
    plan = screener.plan()
    figures = {
        "rows": rows,
        "rows_used": used,
        "rows_quarantined": plan.count,
        # Streamed rows kept plus rows set aside, against the files' footers (``rows``).
        "rows_used_plus_quarantined": used + plan.count,
        "quarantine_rate": plan.rate,
        **dict.fromkeys(QUARANTINE_REASONS, 0),
        **plan.counts(),
        "ts_outside_day": outside_day,
    }
    sample = pa.Table.from_batches(sampled, schema=INTERACTIONS_SCHEMA)
    quarantined = None
    if held is not None:
        quarantined = pa.concat_tables(held) if held else QUARANTINE_SCHEMA.empty_table()
    return InteractionScreen(plan, figures, sample, quarantined)
