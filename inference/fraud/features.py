"""Which fraud features exist, the raw columns they read, and where they are computed.

The features themselves come from a day's :class:`PartitionProfile` (built by
:class:`ProfileBuilder`, both in :mod:`inference.fraud.profile`); this module names them for the
model, training and scoring, which select them by name.
"""

from __future__ import annotations

from collections.abc import Sequence

from inference.fraud.profile import (
    BURST_WINDOWS,
    CHANNELS,
    PROFILE_COLUMNS,
    PartitionProfile,
    ProfileBuilder,
)

__all__ = [
    "FEATURES",
    "FEATURE_COLUMNS",
    "PROFILE_COLUMNS",
    "PartitionProfile",
    "ProfileBuilder",
    "check_feature_names",
]

FEATURE_COLUMNS = [*PROFILE_COLUMNS, "channel"]

FEATURES: tuple[str, ...] = (
    "log_amount",
    "amount_vs_account",
    "hour_sin",
    "hour_cos",
    *(f"channel_{c}" for c in CHANNELS),
    "country_share_account",
    "country_log_frequency",
    "merchant_new_to_account",
    "merchant_log_reach",
    "account_log_txns",
    *BURST_WINDOWS,
)


def check_feature_names(names: Sequence[str]) -> None:
    """Raises ValueError naming any feature this module cannot compute."""
    unknown = [n for n in names if n not in FEATURES]
    if unknown:
        raise ValueError(f"unknown fraud features {unknown}; available: {list(FEATURES)}")
    if not names:
        raise ValueError("at least one feature must be selected")
