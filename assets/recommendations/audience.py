"""Who gets recommendations for a day: the audience, and the record the checks compare with.

A nightly list is precompute: it must be there for every user who may come back, not only for
those who happened to be active on the scored day. The audience is configuration:

- ``recent``: every user with a usable interaction in the ``audience_days`` days up to and
  including the scored day (the trailing window ``(D - audience_days, D]``);
- ``all``: every user with a usable interaction on any landed day up to the scored day.

A user with no new activity still gets a fresh list, from the current model and catalogue,
their whole history up to the day excluded. The scoring step records the definition it used
and the landing days it read (``checks/user_recommendations/date=D/audience.json``), so the
check recomputes the same audience from the same inputs instead of guessing the config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date as Date
from datetime import timedelta
from typing import Literal

import numpy as np

from assets.recommendations.history import read_users
from assets.recommendations.schemas import INTERACTIONS, USER_RECOMMENDATIONS
from inference.engine.output_partition import input_fingerprint
from resources.storage import DataStore

AudienceMode = Literal["recent", "all"]
DEFAULT_AUDIENCE_DAYS = 90


@dataclass(frozen=True)
class Audience:
    """The users to recommend for on ``date`` and how they were chosen."""

    date: str
    mode: AudienceMode
    days: int
    dates: list[str]  # the landing days whose users make it up
    users: np.ndarray  # sorted, unique

    def record(self, store: DataStore) -> dict:
        """The definition, the days read (with their files' identity) and the size."""
        files = [f for d in self.dates for f in store.landing_files(INTERACTIONS, d)]
        return {
            "date": self.date,
            "audience": self.mode,
            "audience_days": self.days if self.mode == "recent" else None,
            "dates": self.dates,
            "inputs": [list(f) for f in input_fingerprint(store.fs, files)],
            "users": len(self.users),
        }


def audience_dates(landed: list[str], date: str, mode: AudienceMode, days: int) -> list[str]:
    """The landed days up to ``date`` whose users are the audience of ``date``."""
    history = [d for d in landed if d <= date]
    if mode == "all":
        return history
    first = (Date.fromisoformat(date) - timedelta(days=days - 1)).isoformat()
    return [d for d in history if d >= first]


def build_audience(
    store: DataStore, landed: list[str], date: str, mode: AudienceMode, days: int
) -> Audience:
    """Reads the user ids of the audience's days (one column, batch by batch)."""
    dates = audience_dates(landed, date, mode, days)
    return Audience(date, mode, days, dates, read_users(store, dates))


def _record_path(store: DataStore, date: str) -> str:
    return f"{store.path('checks', USER_RECOMMENDATIONS, f'date={date}')}/audience.json"


def save_audience(store: DataStore, audience: Audience) -> None:
    record = json.dumps(audience.record(store)).encode()
    store.write_bytes(_record_path(store, audience.date), record)


def recorded_audience(store: DataStore, date: str) -> Audience | None:
    """The audience the scoring step recorded for ``date``, recomputed from the days it read;
    None when no scoring step recorded one (a partition published before audiences)."""
    try:
        record = json.loads(store.read_bytes(_record_path(store, date)))
    except (FileNotFoundError, OSError, ValueError):
        return None
    dates = list(record["dates"])
    mode = record["audience"]
    days = record["audience_days"] or 0
    return Audience(date, mode, days, dates, read_users(store, dates))
