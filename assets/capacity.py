"""Which capacity a day's next stretch runs on: the deadline-aware policy's decision from the
day's ledger (:meth:`OpenDay.night_facts`), said on the run at its launch and carried in its
retry's tags."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

from dagster import AssetExecutionContext

from inference.engine.ledger import OpenDay
from policy.deadline import IDLE, CapacityDecision
from policy.ready_by import NightFacts, deadline_decision, retry_tags
from policy.tags import CAPACITY_REASON_TAG, CAPACITY_TAG, ON_DEMAND


def capacity_of(tags: Mapping[str, str]) -> str:
    """The capacity a run was launched on: on-demand once the spot swap moved it there."""
    return "on_demand" if tags.get(CAPACITY_TAG) == ON_DEMAND else "spot"


def decide(facts: Callable[[], NightFacts]) -> tuple[CapacityDecision | None, str]:
    """The deadline-aware decision for the day's next stretch, or None and why not; a
    ledger that cannot be read leaves the decision to the count-based switch, said so."""
    try:
        return deadline_decision(facts())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"deadline-aware policy skipped ({exc}); the count-based switch decides"


def say_at_launch(
    context: AssetExecutionContext, what: str, decision: CapacityDecision | None, why: str
) -> None:
    """The policy's view at a day's first launch: the run cannot move itself, but a day
    that cannot make its ready-by says so now, on its run and in its log."""
    if decision is None:
        return
    context.instance.add_run_tags(context.run_id, {CAPACITY_REASON_TAG: decision.reason})
    log = context.log.warning if decision.cannot_make_it else context.log.info
    log(f"{what} at launch: {why}")


def retry_capacity(
    context: AssetExecutionContext,
    on_demand_after: int,
    count: int,
    day: OpenDay | None,
    decided: Callable[[CapacityDecision | None], None] | None = None,
) -> dict[str, str]:
    """The retry's capacity tags: the deadline-aware policy's choice for the interrupted day
    (its node is gone: idle), logged with its reason; the count-based switch where the policy
    does not apply. ``decided`` is told the decision (the day's metrics)."""
    tags = context.run.tags
    decision, why = None, ""
    if day is not None:
        decision, why = decide(partial(day.night_facts, count, IDLE, tags, on_demand_after))
        log = context.log.warning if decision and decision.cannot_make_it else context.log.info
        log(f"{day.asset} {day.date} retry: {why}")
        if decided is not None:
            decided(decision)
    return retry_tags(decision, count, on_demand_after, tags)
