"""The one daily partitioning every nightshift asset shares."""

import os
import warnings

from dagster import BetaWarning, DailyPartitionsDefinition

DEFAULT_START_DATE = "2026-01-01"

# Read once when the code location loads: Dagster needs the partition set to build the asset
# graph, and every domain must agree on it, so this is the single place it is decided.
START_DATE = os.environ.get("NIGHTSHIFT_START_DATE", DEFAULT_START_DATE)

# The last partition is the last completed UTC day: a nightly run scores yesterday.
daily_partitions = DailyPartitionsDefinition(start_date=START_DATE, timezone="UTC")

# Every partitioned asset passes `backfill_policy=BackfillPolicy.single_run()` so a range backfill
# is one run with one model load; Dagster flags that parameter as beta on each decorator. The
# behaviour is relied on and tested here, so the repeated warning is silenced for it alone.
warnings.filterwarnings("ignore", message=r"Parameter `backfill_policy`", category=BetaWarning)
