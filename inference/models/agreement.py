"""How far a challenger's shadow output of a day agrees with the champion's, and whether that
day is clean.

Plain functions over the two published tables (no Dagster): the shadow asset computes them
after both are committed, tests recompute them from the same parquet files.

- Flagged rows (fraud): the Jaccard index of the ids each version flagged at its own alert
  threshold (the challenger's is the threshold it would alert at once promoted), the counts
  behind it, and the population stability index (PSI) of the two score distributions.
- Ranked lists (recommendations): per user, the share of the champion's top-K the challenger
  also recommends, averaged over the users both ranked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inference.engine.invariants import population_stability

# Equal-width bins over [0, 1], the bins of the fraud output's own score histogram and its
# drift check against training, so a shadow's PSI reads on the same scale.
SCORE_BINS = 20
Figures = dict[str, float]
# (champion's table, challenger's table) -> figures
Agreement = Callable[[pa.Table, pa.Table], Figures]


@dataclass(frozen=True)
class Limit:
    """A bound a clean day's figure stays within: ``at_least`` and/or ``at_most``."""

    metric: str
    at_least: float | None = None
    at_most: float | None = None

    def breach(self, figures: Mapping[str, float]) -> str | None:
        """Why ``figures`` break this limit (``flagged_jaccard 0.41 < 0.5``), or None."""
        value = figures[self.metric]
        if self.at_least is not None and value < self.at_least:
            return f"{self.metric} {value:.4g} < {self.at_least}"
        if self.at_most is not None and value > self.at_most:
            return f"{self.metric} {value:.4g} > {self.at_most}"
        return None


def breaches(figures: Mapping[str, float], limits: Sequence[Limit]) -> list[str]:
    """Every limit the day's figures break; a clean day breaks none."""
    return [why for limit in limits if (why := limit.breach(figures)) is not None]


def score_histogram(scores: np.ndarray, bins: int = SCORE_BINS) -> np.ndarray:
    """Counts of ``scores`` in ``bins`` equal-width bins of [0, 1] (1.0 in the last bin)."""
    return np.histogram(np.clip(scores, 0.0, 1.0), bins=bins, range=(0.0, 1.0))[0]


def flagged_agreement(
    champion: pa.Table,
    challenger: pa.Table,
    *,
    id_column: str,
    score_column: str = "score",
    flag_column: str = "flagged",
    bins: int = SCORE_BINS,
) -> Figures:
    """Flagged overlap and score PSI of two scorings of the same rows.

    Returns:
        ``rows_champion``, ``rows_challenger``, ``rows_unmatched`` (ids scored by one version
        only), ``flagged_champion``, ``flagged_challenger``, ``flagged_both``,
        ``flagged_jaccard`` (1.0 when neither flagged anything) and ``score_psi`` (champion's
        histogram as expected, challenger's as actual; 0.0 when either is empty).
    """
    flagged = [_flagged_ids(t, id_column, flag_column) for t in (champion, challenger)]
    union = flagged[0] | flagged[1]
    both = flagged[0] & flagged[1]
    histograms = [score_histogram(_floats(t, score_column), bins) for t in (champion, challenger)]
    return {
        "rows_champion": champion.num_rows,
        "rows_challenger": challenger.num_rows,
        "rows_unmatched": _only_in(champion[id_column], challenger[id_column])
        + _only_in(challenger[id_column], champion[id_column]),
        "flagged_champion": len(flagged[0]),
        "flagged_challenger": len(flagged[1]),
        "flagged_both": len(both),
        "flagged_jaccard": round(len(both) / len(union), 6) if union else 1.0,
        "score_psi": round(population_stability(*histograms), 6),
    }


def topk_agreement(
    champion: pa.Table,
    challenger: pa.Table,
    *,
    user_column: str = "user_id",
    item_column: str = "item_id",
) -> Figures:
    """Top-K overlap of two rankings of the same users.

    A user's overlap is the number of items both lists hold over the longer list's length
    (K, unless a user had fewer items left to recommend).

    Returns:
        ``users_champion``, ``users_challenger``, ``users_unmatched`` (users one version
        ranked only), ``mean_topk_overlap`` over the users both ranked (1.0 when none),
        ``min_topk_overlap`` and ``users_no_overlap`` (users sharing no item).
    """
    frames = [t.select([user_column, item_column]).to_pandas() for t in (champion, challenger)]
    sizes = [f.groupby(user_column).size() for f in frames]
    common = sizes[0].index.intersection(sizes[1].index)
    shared = (
        frames[0]
        .merge(frames[1].drop_duplicates(), on=[user_column, item_column])
        .groupby(user_column)
        .size()
        .reindex(common, fill_value=0)
    )
    longest = np.maximum(sizes[0].reindex(common), sizes[1].reindex(common))
    overlap = (shared / longest).to_numpy(np.float64) if len(common) else np.ones(0)
    return {
        "users_champion": len(sizes[0]),
        "users_challenger": len(sizes[1]),
        "users_unmatched": len(sizes[0].index.symmetric_difference(sizes[1].index)),
        "mean_topk_overlap": round(float(overlap.mean()), 6) if len(overlap) else 1.0,
        "min_topk_overlap": round(float(overlap.min()), 6) if len(overlap) else 1.0,
        "users_no_overlap": int((overlap == 0).sum()),
    }


def _flagged_ids(table: pa.Table, id_column: str, flag_column: str) -> set:
    return set(pc.filter(table[id_column], pc.fill_null(table[flag_column], False)).to_pylist())


def _only_in(ids: pa.ChunkedArray, other: pa.ChunkedArray) -> int:
    """How many of ``ids`` are not among ``other``."""
    return (
        len(ids) - pc.sum(pc.is_in(ids, value_set=other.combine_chunks())).as_py()
        if len(ids)
        else 0
    )


def _floats(table: pa.Table, column: str) -> np.ndarray:
    return table[column].to_numpy(zero_copy_only=False).astype(np.float64)
