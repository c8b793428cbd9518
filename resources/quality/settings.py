"""The data-quality settings of a run: its config, and the one place the deployment's
quarantine limit is read from the environment."""

from __future__ import annotations

import os

from dagster import Config
from pydantic import Field as PydanticField

DEFAULT_SAMPLE_ROWS = 10_000
DEFAULT_SEED = 0
# The share of a partition's rows that may be quarantined before the run fails instead.
DEFAULT_MAX_QUARANTINE_RATE = 0.01
QUARANTINE_RATE_VARIABLE = "NIGHTSHIFT_MAX_QUARANTINE_RATE"


def quarantine_limit(override: float | None = None) -> float:
    """The quarantine rate above which a run fails: the asset's config when set, else the
    deployment's ``NIGHTSHIFT_MAX_QUARANTINE_RATE``, else 1%. Read when a run starts, so the
    landing checks and the scoring step of one deployment apply the same limit."""
    if override is not None:
        return override
    raw = os.environ.get(QUARANTINE_RATE_VARIABLE)
    if not raw:
        return DEFAULT_MAX_QUARANTINE_RATE
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{QUARANTINE_RATE_VARIABLE}={raw!r} is not a number") from exc
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{QUARANTINE_RATE_VARIABLE}={raw!r} is not a rate in [0, 1]")
    return value


class QualityConfig(Config):
    """Data-quality settings every asset with quality gates takes in its run config."""

    max_quarantine_rate: float | None = PydanticField(
        default=None,
        ge=0.0,
        le=1.0,
        description="Share of a partition's rows that may be quarantined before the run fails "
        "and publishes nothing; default $NIGHTSHIFT_MAX_QUARANTINE_RATE, else 0.01.",
    )
    check_sample_rows: int = PydanticField(
        default=DEFAULT_SAMPLE_ROWS,
        ge=0,
        description="Rows of the seeded random sample that row-level expectations run on.",
    )
    check_seed: int = PydanticField(default=DEFAULT_SEED, description="The sample's seed.")
