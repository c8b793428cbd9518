"""Which capacity a day's next stretch runs on: the deadline-aware policy's view of the day,
said on the run at its launch and carried in its retry's tags."""

from __future__ import annotations

import time
from collections.abc import Mapping

from dagster import AssetExecutionContext

from inference.engine.ledger import OpenDay, recent_rate
from policy.deadline import IDLE, CapacityDecision
from policy.ready_by import NightFacts, deadline_decision, ready_by, retry_tags
from policy.tags import CAPACITY_REASON_TAG, CAPACITY_TAG, ON_DEMAND


def capacity_of(tags: Mapping[str, str]) -> str:
    """The capacity a run was launched on: on-demand once the spot swap moved it there."""
    return "on_demand" if tags.get(CAPACITY_TAG) == ON_DEMAND else "spot"


def night_facts(
    day: OpenDay,
    interruptions: int,
    current: str,
    tags: Mapping[str, str],
    on_demand_after: int,
) -> NightFacts:
    """What the capacity policy is told about the day: rows left, the asset's recent rate
    and restart overhead (this day's own before any day was committed), its ready-by."""
    recent = day.book.recent()
    rate = recent_rate(recent) or day.ledger.rows_per_second()
    overheads = [o for x in (day.ledger, *recent) if (o := x.restart_overhead_s())]
    totals = [x.rows_total for x in recent if x.rows_total]
    total = day.ledger.rows_total or (round(sum(totals) / len(totals)) if totals else None)
    return NightFacts(
        rows_left=max((total or 0) - day.rows_done(), 0),
        rows_total=total,
        rows_per_second=rate,
        restart_overhead_s=overheads[0] if overheads else None,
        first_started=day.ledger.attempts[0].started,
        now=time.time(),
        ready=ready_by(day.asset, day.date, tags),
        interruptions=interruptions,
        on_demand_after=on_demand_after,
        current=current,
    )


def night_decision(
    day: OpenDay,
    interruptions: int,
    tags: Mapping[str, str],
    on_demand_after: int,
    current: str = IDLE,
) -> tuple[CapacityDecision | None, str]:
    """The deadline-aware decision for the day's next stretch, or None and why not; a
    ledger that cannot be read leaves the decision to the count-based switch, said so."""
    try:
        return deadline_decision(night_facts(day, interruptions, current, tags, on_demand_after))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"deadline-aware policy skipped ({exc}); the count-based switch decides"


def say_at_launch(context: AssetExecutionContext, day: OpenDay, on_demand_after: int) -> None:
    """The policy's view at a day's first launch: the run cannot move itself, but a day
    that cannot make its ready-by says so now, on its run and in its log."""
    tags = context.run.tags
    decision, why = night_decision(day, 0, tags, on_demand_after, capacity_of(tags))
    if decision is None:
        return
    context.instance.add_run_tags(context.run_id, {CAPACITY_REASON_TAG: decision.reason})
    log = context.log.warning if decision.cannot_make_it else context.log.info
    log(f"{day.asset} {day.date} at launch: {why}")


def retry_capacity(
    context: AssetExecutionContext,
    on_demand_after: int,
    count: int,
    day: OpenDay | None,
) -> dict[str, str]:
    """The retry's capacity tags: the deadline-aware policy's choice for the interrupted day
    (its node is gone: idle), logged with its reason; the count-based switch where the policy
    does not apply."""
    tags = context.run.tags
    decision, why = (None, "") if day is None else night_decision(day, count, tags, on_demand_after)
    if day is not None:
        log = context.log.warning if decision and decision.cannot_make_it else context.log.info
        log(f"{day.asset} {day.date} retry: {why}")
    return retry_tags(decision, count, on_demand_after, tags)
