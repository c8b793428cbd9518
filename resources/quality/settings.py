"""The data-quality settings of a run: its config, and the one place the deployment's
quarantine limit is read from the environment."""

from __future__ import annotations

import os

from dagster import Config
from pydantic import Field as PydanticField

from inference.engine.quarantine import QuarantineLimit

DEFAULT_SAMPLE_ROWS = 10_000
DEFAULT_SEED = 0
# The share of a partition's rows that may be quarantined before the run fails instead.
DEFAULT_MAX_QUARANTINE_RATE = 0.01
QUARANTINE_RATE_VARIABLE = "NIGHTSHIFT_MAX_QUARANTINE_RATE"
# Rows any day may quarantine whatever its size: a share alone fails a 29-row day on one row.
DEFAULT_QUARANTINE_FLOOR_ROWS = 10
QUARANTINE_FLOOR_VARIABLE = "NIGHTSHIFT_QUARANTINE_FLOOR_ROWS"


def quarantine_limit(rate: float | None = None, floor_rows: int | None = None) -> QuarantineLimit:
    """The quarantine limit of a run (see :class:`~inference.engine.quarantine.QuarantineLimit`): a
    day fails when more rows are quarantined than the larger of the share x rows and the floor
    (which never covers more than half a day).

    Each part is the asset's config when set, else the deployment's environment variable
    (``NIGHTSHIFT_MAX_QUARANTINE_RATE``, ``NIGHTSHIFT_QUARANTINE_FLOOR_ROWS``), else 1% and
    10 rows. Read when a run starts, so the landing checks and the scoring step of one
    deployment apply the same limit.
    """
    if rate is None:
        rate = _from_environment(QUARANTINE_RATE_VARIABLE, float, DEFAULT_MAX_QUARANTINE_RATE)
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{QUARANTINE_RATE_VARIABLE}={rate!r} is not a rate in [0, 1]")
    if floor_rows is None:
        floor_rows = _from_environment(
            QUARANTINE_FLOOR_VARIABLE, int, DEFAULT_QUARANTINE_FLOOR_ROWS
        )
        if floor_rows < 0:
            raise ValueError(f"{QUARANTINE_FLOOR_VARIABLE}={floor_rows!r} is negative")
    return QuarantineLimit(rate, floor_rows)


def _from_environment(variable: str, kind: type, default: float) -> float:
    raw = os.environ.get(variable)
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError as exc:
        noun = "a number" if kind is float else "a whole number"
        raise ValueError(f"{variable}={raw!r} is not {noun}") from exc


class QualityConfig(Config):
    """Data-quality settings every asset with quality gates takes in its run config."""

    max_quarantine_rate: float | None = PydanticField(
        default=None,
        ge=0.0,
        le=1.0,
        description="Share of a partition's rows that may be quarantined before the run fails "
        "and publishes nothing (unless within quarantine_floor_rows); default "
        "$NIGHTSHIFT_MAX_QUARANTINE_RATE, else 0.01.",
    )
    quarantine_floor_rows: int | None = PydanticField(
        default=None,
        ge=0,
        description="Rows any partition may quarantine without failing, however small, up to "
        "half its rows: the limit is the larger of this and max_quarantine_rate x rows; "
        "default $NIGHTSHIFT_QUARANTINE_FLOOR_ROWS, else 10.",
    )
    check_sample_rows: int = PydanticField(
        default=DEFAULT_SAMPLE_ROWS,
        ge=0,
        description="Rows of the seeded random sample that row-level expectations run on.",
    )
    check_seed: int = PydanticField(default=DEFAULT_SEED, description="The sample's seed.")
