"""The audience of a day's recommendations read out of storage, and the record the checks
compare with.

Who is in the audience (``recent`` days or ``all`` landed days) is defined in
``inference/recs/audience.py``; here its days' users are read. A user with no new activity still
gets a fresh list, from the current model and catalogue, their whole history up to the day
excluded. The scoring step records the definition it used and the landing days it read
(``checks/user_recommendations/date=D/audience.json``), so the check recomputes the same
audience from the same inputs instead of guessing the config.
"""

from __future__ import annotations

import json

from assets.recommendations.history import read_users
from assets.recommendations.schemas import INTERACTIONS, USER_RECOMMENDATIONS
from inference.engine.output_partition import input_fingerprint
from inference.recs.audience import Audience, AudienceMode, audience_dates
from resources.storage import DataStore

DEFAULT_AUDIENCE_DAYS = 90


def build_audience(
    store: DataStore, landed: list[str], date: str, mode: AudienceMode, days: int
) -> Audience:
    """Reads the user ids of the audience's days (one column, batch by batch)."""
    dates = audience_dates(landed, date, mode, days)
    return Audience(date, mode, days, dates, read_users(store, dates))


def _record_path(store: DataStore, date: str) -> str:
    return f"{store.path('checks', USER_RECOMMENDATIONS, f'date={date}')}/audience.json"


def _record(store: DataStore, audience: Audience) -> dict:
    """The definition, the days read (with their files' identity) and the size."""
    files = [f for d in audience.dates for f in store.landing_files(INTERACTIONS, d)]
    return {
        "date": audience.date,
        "audience": audience.mode,
        "audience_days": audience.days if audience.mode == "recent" else None,
        "dates": audience.dates,
        "inputs": [list(f) for f in input_fingerprint(store.fs, files)],
        "users": len(audience.users),
    }


def save_audience(store: DataStore, audience: Audience) -> None:
    record = json.dumps(_record(store, audience)).encode()
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
