"""Spot or on-demand for a partition's next attempt, from what its ledger knows and its ready-by.

The scoring engine calls this at each retry of an interrupted partition (and at a partition's
first attempt, to say early when the day cannot make its deadline). The facts come from the
cost ledger (inference/engine/ledger.py): the rows not yet in finished shards, the rate measured on
the asset's recent days (this day's own attempts when there are none yet), the restart
overhead measured from launch to first shard, and when the night's first attempt started. The
choice is ``policy.deadline.choose_capacity``'s; nothing of the policy is repeated here.

The policy does not apply, and the count-based switch alone decides, where a day's ready-by had
already passed when its first attempt started (a backfill of old days or a late landing: no
morning to plan to), where no rate has been measured yet, or where the day's row count is not
known. The reason says which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from policy.capacity import capacity_tags, tags_for_capacity
from policy.deadline import IDLE, CapacityDecision, choose_capacity, work_seconds
from policy.ready_by import ReadyBy
from policy.tags import CAPACITY_REASON_TAG

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
    work_left = work_seconds(facts.rows_left, facts.rows_per_second)
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
