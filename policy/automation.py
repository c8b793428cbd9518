"""When assets run by themselves and when they are late: the GPU pool, declarative automation
and the freshness deadline. ``orchestration/automation.py`` adds the sensors that act on them.
"""

import datetime as dt

from dagster import AutomationCondition, FreshnessPolicy

# Backfills launched from the asset graph run outside any job and so carry no job tags: the
# GPU-heavy assets also sit in this pool, which the instance limits at run granularity.
GPU_POOL = "gpu"

# How far back a parent's new partitions still update their children: a month-long re-score
# after a model change refreshes that month's alerts and digests, not only yesterday's.
AUTOMATION_LOOKBACK = dt.timedelta(days=31)

# A downstream partition (alerts, digest) materialises once its parent partition is updated and
# every blocking check on the parent passed; never while the parent is missing or still running.
after_parent_passes_checks = (
    AutomationCondition.eager()
    .replace(
        "in_latest_time_window",
        AutomationCondition.in_latest_time_window(lookback_delta=AUTOMATION_LOOKBACK),
    )
    .with_label("eager (31-day lookback)")
    & AutomationCondition.all_deps_blocking_checks_passed()
).with_label("parent updated and its blocking checks passed")

# The business reads scores, recommendations and summaries from 07:00 UTC: the day that just
# ended must be scored between midnight and then, or the asset shows as stale (overdue).
scored_by_0700_utc = FreshnessPolicy.cron(
    deadline_cron="0 7 * * *", lower_bound_delta=dt.timedelta(hours=7), timezone="UTC"
)
