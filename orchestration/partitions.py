"""The one daily partitioning every nightshift asset shares."""

import os

from dagster import DailyPartitionsDefinition

DEFAULT_START_DATE = "2026-01-01"

# Read once when the code location loads: Dagster needs the partition set to build the asset
# graph, and every domain must agree on it, so this is the single place it is decided.
START_DATE = os.environ.get("NIGHTSHIFT_START_DATE", DEFAULT_START_DATE)

# The last partition is the last completed UTC day: a nightly run scores yesterday.
daily_partitions = DailyPartitionsDefinition(start_date=START_DATE, timezone="UTC")
