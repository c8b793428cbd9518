"""Quality gates every domain shares: the landing day and row count a screening starts from,
and the landing contract checks (the suites themselves run in resources/quality).

A domain screens its landing partitions (``assets/<domain>/quality.py``) and hands the screens
here; the suites (``assets/<domain>/suites/*.json``) decide what passes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import pyarrow as pa
from dagster import AssetCheckResult

from inference.engine.quarantine import QuarantineLimit, QuarantinePlan
from policy.partitions import day_end
from resources.quality import CheckSuite, SuiteRun, check_result
from resources.storage import DataStore, LandingDataError

# Landing deadlines are judged for partitions whose day ended at most this long ago.
FRESHNESS_HORIZON = timedelta(days=7)
# The deadline given to GE for older partitions: any landing time passes.
NOT_JUDGED = 1e12


def landed_hours_after_day_end(store: DataStore, dataset: str, date: str) -> float:
    """How long after its UTC day ended a landing partition's last file was written, in hours
    (negative when it landed before the day was over)."""
    files = store.landing_files(dataset, date)
    latest = max(info.mtime.timestamp() for info in store.fs.get_file_info(files) if info.mtime)
    return round((latest - day_end(date).timestamp()) / 3600.0, 3)


class Screen(Protocol):
    """A landing partition's screening: quarantine plan, exact figures, a row sample."""

    plan: QuarantinePlan
    figures: dict[str, Any]
    sample: pa.Table


def day_bounds(date: str, kind: pa.DataType) -> tuple[pa.Scalar, pa.Scalar]:
    """The partition's day, [midnight, next midnight) UTC, as scalars of a timestamp type."""
    start = datetime.fromisoformat(date).replace(tzinfo=UTC)
    return pa.scalar(start, kind), pa.scalar(start + timedelta(days=1), kind)


def landed_rows(
    store: DataStore, dataset: str, date: str, schema: pa.Schema, noun: str = "rows"
) -> int:
    """A landing partition's rows, from its files' footers.

    Raises:
        LandingDataError: the partition is missing, unreadable or malformed, or holds no rows
            (the message names the folder, and says no ``noun``).
    """
    rows = store.count_landing(dataset, date, schema)
    if rows == 0:
        raise empty_landing_error(store, dataset, date, noun)
    return rows


def empty_landing_error(
    store: DataStore, dataset: str, date: str, noun: str = "rows"
) -> LandingDataError:
    """The error for a partition whose parquet files hold no rows, saying which files were
    read and which were skipped (a day whose rows came as CSV, skipped, reads as empty)."""
    folder = store.landing_path(dataset, date)
    listing = store.landing_listing(dataset, date)
    read = ", ".join(f.path[len(folder) + 1 :] for f in listing.files)
    found = f"{len(listing.files)} parquet file(s) with no rows ({read})"
    if listing.skipped:
        names = [path[len(folder) + 1 :] for path in listing.skipped]
        found += f"; {len(names)} file(s) skipped, not read: {', '.join(names)}"
    return LandingDataError(
        f"landing partition empty: dataset '{dataset}', date {date}: no {noun} under "
        f"{store.uri(folder)}: {found}"
    )


@dataclass(frozen=True)
class LandingGate:
    """A landing dataset's contract: its suites, and which quarantine reasons each check
    counts (shown in its metadata, and in its description when it fails)."""

    dataset: str
    suites: Mapping[str, CheckSuite]
    reasons_by_check: Mapping[str, Sequence[str]]

    def check_results(
        self,
        store: DataStore,
        screens: Mapping[str, Screen],
        *,
        max_quarantine_rate: QuarantineLimit | float,
        deadline_hours: float,
        sample_rows: int,
        seed: int,
    ) -> list[AssetCheckResult]:
        """The dataset's suites over each day's screening figures and row sample.

        A failing contract check is WARN while the rows it concerns stay within the quarantine
        limit (scoring sets them aside) and ERROR above it, which blocks scoring before
        inference; its description says which, with the rate and the reasons.
        """
        limit = QuarantineLimit.of(max_quarantine_rate)
        run = SuiteRun(self.suites)
        judged = []
        for date, screen in screens.items():
            late = landed_hours_after_day_end(store, self.dataset, date)
            figures = {**screen.figures, "hours_after_day_end": late}
            recent = _recent(date)
            if recent:
                judged.append(date)
            deadline = deadline_hours if recent else NOT_JUDGED
            run.add(date, figures, screen.sample.to_pandas(), {"deadline_hours": deadline})
        worst = max((s.plan.rate for s in screens.values()), default=0.0)
        shared = {
            "rows": sum(s.plan.rows for s in screens.values()),
            "rows_to_quarantine": sum(s.plan.count for s in screens.values()),
            "worst_quarantine_rate": round(worst, 6),
            "max_quarantine_rate": limit.rate,
            "quarantine_floor_rows": limit.floor_rows,
            "sample_rows": sample_rows,
            "sample_seed": seed,
            "deadline_hours": deadline_hours,
            "freshness_judged_partitions": len(judged),
        }
        shared = run.sample_figures(shared)
        within = not any(limit.exceeded(s.plan.count, s.plan.rows) for s in screens.values())
        results = []
        for name, suite in self.suites.items():
            failed = run.failed(name)
            counts = {
                r: sum(int(s.figures.get(r, 0)) for s in screens.values())
                for r in self.reasons_by_check.get(name, ())
            }
            # Rows the contract rejects are quarantined while they stay within the limit.
            severity = "WARN" if suite.blocking and failed and within else None
            why = (
                _verdict(counts, shared, limit, within) if failed and any(counts.values()) else None
            )
            results.append(
                check_result(suite, run.evidence[name], {**shared, **counts}, severity, why)
            )
        return results


def _recent(date: str) -> bool:
    """Whether a partition's landing time says anything about the nightly delivery: a day
    replayed or backfilled long after it ended was never due by its deadline."""
    return datetime.now(UTC) - day_end(date) <= FRESHNESS_HORIZON


def _verdict(counts: dict[str, int], shared: dict, limit: QuarantineLimit, within: bool) -> str:
    """Says what a failed contract check means for scoring: quarantine, or a blocked day."""
    rate = shared["worst_quarantine_rate"]
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(counts.items(), key=lambda x: -x[1]) if n)
    outcome = (
        "they will be quarantined, not scored"
        if within
        else "above the quarantine limit: scoring is blocked and nothing will be published"
    )
    return (
        f"{shared['rows_to_quarantine']} of {shared['rows']} rows cannot be scored "
        f"({rate:.2%}, limit {limit.describe(shared['rows'])}): {reasons}; {outcome}"
    )
