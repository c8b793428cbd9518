"""The fraud domain's quality gates: Great Expectations suites (``suites/*.json``) over exact
figures from the screening pass and the scoring engine, plus a seeded sample of rows, and the
alerts' count against the flagged scores. The assets that produce the data evaluate them, so a
failing ERROR check stops what is downstream in the same run.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
from dagster import AssetCheckResult

from assets.fraud.schemas import SCORES, TRANSACTIONS
from assets.gates import LandingGate
from assets.partitions import PartitionReport
from inference.engine.invariants import StreamStats, population_stability
from inference.engine.output_partition import ShardReport
from inference.fraud.screening import QUARANTINED_REASONS
from inference.tabular.ranges import CLAMPED_PREFIX, REVIEW, FeatureRanges
from resources.quality import SuiteRun, load_suites, sample_output
from resources.storage import DataStore

SUITES = Path(__file__).parent / "suites"
LANDING_SUITES = load_suites(SUITES / "transactions.json")
SCORE_SUITES = load_suites(SUITES / "fraud_scores.json")
# The `transactions` suites over each day's screening figures and landing sample.
TRANSACTIONS_GATE = LandingGate(TRANSACTIONS, LANDING_SUITES, QUARANTINED_REASONS)
transactions_check_results = TRANSACTIONS_GATE.check_results
# The flagged rate may move this far (relative) from its trailing mean before it warns, on top
# of three binomial standard deviations, so a small day does not warn on noise alone.
FLAGGED_RATE_TOLERANCE = 0.5
TRAILING_DAYS = 7
# Population stability above 0.25 is the usual reading of "the population has shifted".
MAX_SCORE_PSI = 0.25
MAX_FEATURE_PSI = 0.25
# Fewer scored rows than this and a feature's PSI is mostly sampling noise (on a generated
# 2,000-row day one feature read 0.33 against another day of the same population; at 10,000
# rows every feature read below 0.09): the drift check then passes and says so.
MIN_DRIFT_ROWS = 5_000
# Up to this share of a day's transactions may be marked for review (a feature beyond its
# training range by more than a tenth of the range's width) before it warns: more means the
# model no longer fits the data.
MAX_REVIEW_RATE = 0.01


def score_check_results(
    store: DataStore,
    reports: list[PartitionReport],
    *,
    version: str,
    threshold: float,
    reference: list[int] | None,
    sample_rows: int,
    seed: int,
    ranges: FeatureRanges | None = None,
) -> list[AssetCheckResult]:
    """The `fraud_scores` suites over each partition's exact statistics and published sample."""
    run = SuiteRun(SCORE_SUITES)
    psi: dict[str, float] = {}
    flagged_rates: dict[str, float] = {}
    feature_psi: dict[str, float] = {}
    review: dict[str, int] = {}
    for report in reports:
        date = report.date
        figures = score_figures(report, reference, ranges)
        psi[date], flagged_rates[date] = figures["score_psi"], figures["flagged_rate"]
        assert report.shards is not None
        feature_psi = feature_drift(report.shards, ranges)
        review = clamped_features(report.shards.stats)
        sample = report.sample
        if sample is None:  # a resumed attempt did not see every row stream past
            sample = sample_output(store, SCORES, date, sample_rows, seed)
        if len(sample):
            sample["score_reaches_threshold"] = sample["score"].astype(np.float32) >= np.float32(
                threshold
            )
        parameters = {
            **flagged_rate_bounds(store, date, figures["rows_out"]),
            "max_psi": MAX_SCORE_PSI,
            "max_feature_psi": MAX_FEATURE_PSI,
            "max_review_rate": MAX_REVIEW_RATE,
            "model_versions": [version],
        }
        run.add(date, figures, sample, parameters)
    shared = {"sample_rows": sample_rows, "sample_seed": seed}
    extra = {
        "flagged_rate_near_trailing_mean": {"flagged_rate": _last(flagged_rates)},
        "score_distribution_matches_training": {
            "score_psi": _last(psi),
            "training_reference": reference is not None,
        },
        "features_within_training_range": {
            "clamped_rows_per_feature": review,
            "training_ranges": ranges is not None,
        },
        "feature_drift_below_limit": {
            "feature_psi": {k: round(v, 4) for k, v in sorted(feature_psi.items())},
            "training_ranges": ranges is not None,
            "min_rows_to_judge": MIN_DRIFT_ROWS,
        },
    }
    return run.results(shared, extra)


def _last(values: dict[str, float]) -> float:
    return round(list(values.values())[-1], 6) if values else 0.0


def score_figures(
    report: PartitionReport,
    reference: list[int] | None,
    ranges: FeatureRanges | None = None,
) -> dict[str, float | int]:
    """One partition's exact statistics, beside the engine's row conservation figures."""
    shards = report.shards
    assert shards is not None, "fraud_scores is always scored through the sharded engine"
    stats = shards.stats
    counts = stats.counts
    rows_out = shards.rows_out
    figures: dict[str, float | int] = {
        **report.conservation,
        "score_min": stats.minima.get("score", 0.0),
        "score_max": stats.maxima.get("score", 0.0),
        "flagged_rate": counts.get("flagged", 0) / rows_out if rows_out else 0.0,
        "score_psi": (
            population_stability(reference, stats.histograms["score"])
            if reference and "score" in stats.histograms
            else 0.0
        ),
    }
    for name in (
        "score_null",
        "score_not_finite",
        "score_outside_unit_interval",
        "flag_mismatch",
        "model_version_missing",
        "ids_not_passed_through",
        "transaction_id_null",
        "flagged",
    ):
        figures[name] = counts.get(name, 0)
    figures["needs_review"] = counts.get(REVIEW, 0)
    figures["review_rate"] = figures["needs_review"] / rows_out if rows_out else 0.0
    figures["max_feature_psi"] = max(feature_drift(shards, ranges).values(), default=0.0)
    return figures


def feature_drift(shards: ShardReport, ranges: FeatureRanges | None) -> dict[str, float]:
    """Each feature's PSI against training; none for a model without ranges or a day too small
    to judge (MIN_DRIFT_ROWS)."""
    if ranges is None or shards.rows_scored < MIN_DRIFT_ROWS:
        return {}
    return ranges.drift(shards.stats)


def clamped_features(stats: StreamStats) -> dict[str, int]:
    """Rows clamped to the training range, per feature, from a partition's statistics."""
    return {
        name.removeprefix(CLAMPED_PREFIX): n
        for name, n in sorted(stats.counts.items())
        if name.startswith(CLAMPED_PREFIX)
    }


def flagged_rate_bounds(store: DataStore, date: str, rows: int) -> dict[str, float]:
    """Bounds of the flagged rate from the trailing days' published rates (0..1 without any)."""
    rates = trailing_flagged_rates(store, date, TRAILING_DAYS)
    if not rates:
        return {"flagged_rate_low": 0.0, "flagged_rate_high": 1.0}
    mean = float(np.mean(rates))
    noise = 3 * np.sqrt(mean * (1 - mean) / max(rows, 1))
    return {
        "flagged_rate_low": max(0.0, mean * (1 - FLAGGED_RATE_TOLERANCE) - noise),
        "flagged_rate_high": min(1.0, mean * (1 + FLAGGED_RATE_TOLERANCE) + noise),
    }


def trailing_flagged_rates(store: DataStore, date: str, days: int) -> list[float]:
    """Flagged rates of the published ``fraud_scores`` partitions of the ``days`` before ``date``.

    Read from the days' snapshot summaries on main, where the engine saved their exact
    statistics, so the drift check reads table metadata instead of a week of scores.
    """
    day = datetime.fromisoformat(date).date()
    rates = []
    for back in range(1, days + 1):
        earlier = (day - timedelta(days=back)).isoformat()
        committed = store.output_figures(SCORES, earlier)
        if committed is None:
            continue
        flagged = (committed.value("stats") or {}).get("counts", {}).get("flagged")
        rows = committed.value("rows")
        if flagged is not None and rows:
            rates.append(flagged / rows)
    return rates


def alert_check_result(flagged: int, alerts: int) -> AssetCheckResult:
    """`alert_count_matches_flagged_scores`: every flagged score became exactly one alert."""
    return AssetCheckResult(
        check_name="alert_count_matches_flagged_scores",
        passed=flagged == alerts,
        metadata={"flagged_scores": flagged, "alerts": alerts},
    )
