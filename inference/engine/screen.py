"""A screen any scoring spec can use: rows with no id, a missing or non-finite feature, or a
repeated id are quarantined with their reason, before the model sees any row.

A domain with rules of its own (amounts under a ceiling, times inside the day) builds its plan
with :class:`inference.engine.quarantine.Screener` directly; these are the rules every tabular model
needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa

from inference.engine.quarantine import QuarantinePlan, Screener, is_null, not_finite


def screen_required(
    batches: Iterable[pa.RecordBatch], key: str, features: Sequence[str]
) -> QuarantinePlan:
    """Screens one partition, streamed in its deterministic input order.

    Args:
        batches: the partition's rows (the same stream, in the same order, as the scoring).
        key: the id column; the first clean row of an id is scored, any later one is
            quarantined as ``duplicate_<key>`` (two answers for one id would be published).
        features: numeric columns the model reads: a null is ``null_<feature>``, NaN or an
            infinity ``non_finite_<feature>``.

    Returns:
        which rows to quarantine and why; a row that breaks several rules gets the first of
        ``null_<key>``, ``null_<feature>``, ``non_finite_<feature>``, ``duplicate_<key>``.
    """
    screener = Screener()
    for batch in batches:
        rules = {f"null_{key}": is_null(batch[key])}
        rules.update({f"null_{name}": is_null(batch[name]) for name in features})
        rules.update({f"non_finite_{name}": not_finite(batch[name]) for name in features})
        screener.add(batch.num_rows, rules)
        screener.keys(batch[key], f"duplicate_{key}")
    return screener.plan()
