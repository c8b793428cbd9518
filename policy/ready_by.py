"""When a scored day must be ready (its ready-by, the deadline the capacity policy plans to), and
spot or on-demand for a partition's next attempt to make it.

The freshness policy (policy/automation.py) reads the day that just ended as due by 07:00 UTC;
that is the default ready-by of every scoring asset. ``NIGHTSHIFT_READY_BY`` changes it, for
all assets (``06:30``) or per asset (``fraud_scores=05:00,document_summaries=09:00,07:00``:
the pairs name assets, a bare time is everyone else's). A run tagged ``nightshift/ready_by``
with an ISO date-time has that deadline instead, and so have its retries (they inherit tags).

The scoring engine asks :func:`deadline_decision` at each retry of an interrupted partition
(and at a partition's first attempt, to say early when the day cannot make its deadline). The
facts come from the cost ledger (inference/engine/ledger.py): the rows not yet in finished
shards, the rate measured on the asset's recent days (this day's own attempts when there are
none yet), the restart overhead measured from launch to first shard, and when the night's first
attempt started. The choice is ``policy.deadline.choose_capacity``'s; nothing of the policy is
repeated here.

The policy does not apply, and the count-based switch alone decides, where a day's ready-by had
already passed when its first attempt started (a backfill of old days or a late landing: no
morning to plan to), where no rate has been measured yet, or where the day's row count is not
known. The reason says which.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from dataclasses import dataclass

from policy.capacity import capacity_tags, tags_for_capacity
from policy.deadline import IDLE, CapacityDecision, choose_capacity, work_seconds
from policy.tags import CAPACITY_REASON_TAG, READY_BY_TAG

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


# The restart overhead before one was measured: the simulator's d of 2 minutes (an ECS task
# on a warm GPU node, image pulled, model loaded).
DEFAULT_RESTART_OVERHEAD_S = 120.0


@dataclass(frozen=True)
class NightFacts:
    """What the policy is told about one partition's night, in seconds and epoch seconds."""

    rows_left: int
    rows_total: int | None
    rows_per_second: float | None
    restart_overhead_s: float | None
    first_started: float
    now: float
    ready: ReadyBy
    interruptions: int
    on_demand_after: int | None
    current: str = IDLE
    # Seconds the day's attempts waited on stuck model calls before the progress watchdog
    # gave up: counted as work left, since a day that stalled once may stall again.
    stalled_s: float = 0.0


def deadline_decision(facts: NightFacts) -> tuple[CapacityDecision | None, str]:
    """The policy's decision for the next attempt, or None and why the policy does not apply."""
    label = facts.ready.label
    if facts.ready.seconds_from(facts.first_started) <= 0:
        return None, (
            f"no deadline: {label} of the morning after the day had passed when its first "
            "attempt started (a backfill); the count-based switch decides"
        )
    if facts.rows_per_second is None:
        return None, "no rate measured on this asset yet; the count-based switch decides"
    if facts.rows_total is None:
        return None, "the day's row count is not known yet; the count-based switch decides"
    if facts.rows_left <= 0:
        return None, "no rows left to score"
    work_left = work_seconds(facts.rows_left, facts.rows_per_second) + facts.stalled_s
    total = max(work_seconds(facts.rows_total, facts.rows_per_second), work_left)
    overhead = facts.restart_overhead_s
    decision = choose_capacity(
        work_left_s=work_left,
        time_left_s=facts.ready.seconds_from(facts.now),
        total_work_s=total,
        window_s=facts.ready.seconds_from(facts.first_started),
        restart_overhead_s=DEFAULT_RESTART_OVERHEAD_S if overhead is None else overhead,
        current=facts.current,
        spot_available=None,  # ECS does not say whether spot capacity is there until a launch
        interruptions=facts.interruptions,
        on_demand_after=facts.on_demand_after,
        deadline=label,
    )
    if facts.stalled_s:
        return decision, (
            f"{decision.reason}; {facts.stalled_s:.0f} s lost to stalls counted as work left"
        )
    return decision, decision.reason


def retry_tags(
    decision: CapacityDecision | None,
    interruptions: int,
    on_demand_after: int,
    current_tags: Mapping[str, str] | None,
) -> dict[str, str]:
    """The run tags that put the retry on the chosen capacity: the policy's choice with its
    reason, or, where it does not apply, today's count-based switch."""
    if decision is None:
        return capacity_tags(interruptions, on_demand_after, current_tags=current_tags)
    return {
        **tags_for_capacity(decision.capacity, current_tags=current_tags),
        CAPACITY_REASON_TAG: decision.reason,
    }
