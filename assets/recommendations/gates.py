"""The recommendations domain's quality gates: Great Expectations suites (``suites/*.json``)
over exact figures from the screening pass and from the model as every block of users streamed
through it, plus a seeded sample of rows, evaluated inside the assets that produce the data.
"""

from __future__ import annotations

from pathlib import Path

from dagster import AssetCheckResult

from assets.gates import LandingGate
from assets.partitions import PartitionReport
from assets.recommendations.schemas import INTERACTIONS, USER_RECOMMENDATIONS
from inference.recs.history import QUARANTINE_REASONS
from resources.quality import SuiteRun, load_suites, sample_output
from resources.storage import DataStore

SUITES = Path(__file__).parent / "suites"
INTERACTION_SUITES = load_suites(SUITES / "interactions.json")
RECOMMENDATION_SUITES = load_suites(SUITES / "user_recommendations.json")
# The `interactions` suites over each day's figures and a sample of its rows:
# `interaction_events_are_valid` is WARN while the rows it rejects stay within the quarantine
# limit (they are quarantined, not used) and ERROR above it, naming the rate and the reasons;
# late or early events only ever warn (they still count as history).
INTERACTIONS_GATE = LandingGate(
    INTERACTIONS, INTERACTION_SUITES, {"interaction_events_are_valid": QUARANTINE_REASONS}
)
interactions_check_results = INTERACTIONS_GATE.check_results
LIST_COUNTS = ("users_with_wrong_count", "users_short_of_k", "users_not_asked", "item_id_null")


def recommendation_check_results(
    store: DataStore,
    reports: list[PartitionReport],
    audience_users: dict[str, int],
    unknown_item_shares: dict[str, float],
    *,
    k: int,
    version: str,
    max_unknown_item_share: float,
    sample_rows: int,
    seed: int,
) -> list[AssetCheckResult]:
    """The `user_recommendations` suites over each day's exact statistics and sample."""
    run = SuiteRun(RECOMMENDATION_SUITES)
    for report in reports:
        shards = report.shards
        assert shards is not None, "user_recommendations is always written by the sharded engine"
        stats = shards.stats
        figures = {
            **report.conservation,
            "audience_users": audience_users[report.date],
            "unknown_item_share": round(unknown_item_shares[report.date], 6),
            **{name: stats.counts.get(name, 0) for name in LIST_COUNTS},
            "rank_min": stats.minima.get("rank", 1),
            "rank_max": stats.maxima.get("rank", 1),
        }
        sample = sample_output(store, USER_RECOMMENDATIONS, report.date, sample_rows, seed)
        parameters = {
            "k": k,
            "model_versions": [version],
            "max_unknown_item_share": max_unknown_item_share,
        }
        run.add(report.date, figures, sample, parameters)
    shared = {
        "sample_rows": sample_rows,
        "sample_seed": seed,
        "k": k,
        "max_unknown_item_share": max_unknown_item_share,
    }
    return run.results(shared)
