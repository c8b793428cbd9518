"""Who gets recommendations for a day: the audience's definition and the days it reads.

A nightly list is precompute: it must be there for every user who may come back, not only for
those who happened to be active on the scored day. The audience is configuration:

- ``recent``: every user with a usable interaction in the ``audience_days`` days up to and
  including the scored day (the trailing window ``(D - audience_days, D]``);
- ``all``: every user with a usable interaction on any landed day up to the scored day.

Reading the users of those days, and recording the audience for the checks, is the
recommendations assets' own; no Dagster and no data access here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date as Date
from datetime import timedelta
from typing import Literal

import numpy as np

AudienceMode = Literal["recent", "all"]


@dataclass(frozen=True)
class Audience:
    """The users to recommend for on ``date`` and how they were chosen."""

    date: str
    mode: AudienceMode
    days: int
    dates: list[str]  # the landing days whose users make it up
    users: np.ndarray  # sorted, unique


def audience_dates(landed: list[str], date: str, mode: AudienceMode, days: int) -> list[str]:
    """The landed days up to ``date`` whose users are the audience of ``date``."""
    history = [d for d in landed if d <= date]
    if mode == "all":
        return history
    first = (Date.fromisoformat(date) - timedelta(days=days - 1)).isoformat()
    return [d for d in history if d >= first]
