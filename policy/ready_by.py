"""When a scored day must be ready: its ready-by, the deadline the capacity policy plans to.

The freshness policy (policy/automation.py) reads the day that just ended as due by 07:00 UTC;
that is the default ready-by of every scoring asset. ``NIGHTSHIFT_READY_BY`` changes it, for
all assets (``06:30``) or per asset (``fraud_scores=05:00,document_summaries=09:00,07:00``:
the pairs name assets, a bare time is everyone else's). A run tagged ``nightshift/ready_by``
with an ISO date-time has that deadline instead, and so have its retries (they inherit tags).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from dataclasses import dataclass

from policy.tags import READY_BY_TAG

READY_BY_SETTING = "NIGHTSHIFT_READY_BY"
DEFAULT_READY_BY = "07:00"


@dataclass(frozen=True)
class ReadyBy:
    """A day's deadline as a moment (UTC) and as it reads in a reason (``07:00``)."""

    at: dt.datetime
    label: str

    def seconds_from(self, moment: float) -> float:
        """Seconds from ``moment`` (epoch) to the deadline; negative once it has passed."""
        return self.at.timestamp() - moment


def ready_by_time(asset: str, environ: Mapping[str, str] | None = None) -> dt.time:
    """The asset's daily ready-by time (UTC) from ``NIGHTSHIFT_READY_BY``, else 07:00."""
    raw = (os.environ if environ is None else environ).get(READY_BY_SETTING) or DEFAULT_READY_BY
    default, named = DEFAULT_READY_BY, {}
    for item in (part.strip() for part in raw.split(",") if part.strip()):
        name, sep, value = item.rpartition("=")
        if sep:
            named[name.strip()] = value.strip()
        else:
            default = value
    text = named.get(asset, default)
    try:
        return dt.time.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(
            f"{READY_BY_SETTING}={raw!r}: {text!r} is not a time of day such as 07:00"
        ) from exc


def ready_by(
    asset: str,
    date: str,
    tags: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ReadyBy:
    """The deadline of ``asset``'s day ``date``: the run's ``nightshift/ready_by`` tag, else the
    ready-by time on the morning after the day (the day is complete only once it has ended)."""
    tagged = (tags or {}).get(READY_BY_TAG)
    if tagged:
        try:
            at = dt.datetime.fromisoformat(tagged)
        except ValueError as exc:
            raise ValueError(f"run tag {READY_BY_TAG}={tagged!r} is not an ISO date-time") from exc
        at = at if at.tzinfo else at.replace(tzinfo=dt.UTC)
        return ReadyBy(at, at.astimezone(dt.UTC).strftime("%H:%M"))
    when = ready_by_time(asset, environ)
    morning = dt.date.fromisoformat(date) + dt.timedelta(days=1)
    at = dt.datetime.combine(morning, when, tzinfo=dt.UTC)
    return ReadyBy(at, when.strftime("%H:%M"))
