"""The one daily partitioning every nightshift asset shares, and how a range of it is backfilled."""

import datetime as dt
import os
import warnings

from dagster import BackfillPolicy, BetaWarning, DailyPartitionsDefinition

from policy.settings import positive_int_setting

DEFAULT_START_DATE = "2026-01-01"

# Read once when the code location loads: Dagster needs the partition set to build the asset
# graph, and every domain must agree on it, so this is the single place it is decided.
START_DATE = os.environ.get("NIGHTSHIFT_START_DATE", DEFAULT_START_DATE)

# The last partition is the last completed UTC day: a nightly run scores yesterday.
daily_partitions = DailyPartitionsDefinition(start_date=START_DATE, timezone="UTC")


def day_end(key: str) -> dt.datetime:
    """When a daily partition's UTC day ends: the next midnight, UTC."""
    return dt.datetime.fromisoformat(key).replace(tzinfo=dt.UTC) + dt.timedelta(days=1)


BACKFILL_PARTITIONS_PER_RUN_ENV = "NIGHTSHIFT_BACKFILL_PARTITIONS_PER_RUN"


def backfill_policy_from(partitions_per_run: str | None) -> BackfillPolicy:
    """Single run (one model load for the whole range) unless N partitions per run are asked for.

    Args:
        partitions_per_run: unset or empty for one run per range; a positive integer N splits a
            long backfill into runs of N partitions, which the run launcher can spread over nodes.
    """
    n = positive_int_setting(
        BACKFILL_PARTITIONS_PER_RUN_ENV,
        partitions_per_run,
        "partitions per backfill run",
        "one run per range",
    )
    return BackfillPolicy.single_run() if n is None else BackfillPolicy.multi_run(n)


# Every partitioned asset passes this as `backfill_policy=`: the domains must agree, since a
# backfill of several assets follows one policy. Read when the code location loads.
backfill_policy = backfill_policy_from(os.environ.get(BACKFILL_PARTITIONS_PER_RUN_ENV))

# Dagster flags `backfill_policy` as beta on each decorator. The behaviour is relied on and
# tested here, so the repeated warning is silenced for it alone.
warnings.filterwarnings("ignore", message=r"Parameter `backfill_policy`", category=BetaWarning)
