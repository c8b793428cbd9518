"""Spot or on-demand for a partition's next attempt, from the clock: a deadline-aware policy.

The policy is Uniform Progress from "Can't Be Late" (Wu et al., NSDI 2024), with a pace floor.
A night's job of C0 node-seconds lands R0 seconds before its deadline; the uniform schedule
expects ``ep(t) = t * C0 / R0`` of it done at time t. With C the work left and R the time left,
being behind it (``cp(t) < ep(t)``) reads ``C > R * pace`` with ``pace = C0 / R0``:

1. Cannot make it: R < C (+ d to start a node): even on-demand from now is late, so the
   job goes on-demand and says so.
2. Count bound: after ``on_demand_after`` interruptions, on-demand (today's switch, kept as an
   upper bound an operator sets).
3. Exploitation: a job running on spot stays there until the spot is taken back.
4. Safety net: not on spot and R < C + 2d: on-demand until the end. One more reclaim after a
   spot start would leave less than the work plus a restart.
5. Hysteresis: on on-demand, stay until progress is ahead of the schedule at t + 2d
   (``C <= (R - 2d) * pace``), so the job does not flap and pay the restart overhead twice.
6. Behind the schedule (idle): on-demand, unless spot is known to be there right now
   (Taking Risks: a spot that is available costs less than on-demand for the same progress).
7. On or ahead of the schedule: spot, waiting for it when there is none.

The pace floor: ``pace = max(C0 / R0, min_pace)``. On a loose deadline plain Uniform Progress
(``min_pace=0``) goes on-demand as soon as a reclaim puts it behind a slow schedule, and then
holds on-demand through the hysteresis, while the slack would have let it wait for spot; the
floor makes it wait until the rate still needed passes ``min_pace``. The safety net, not the
schedule, is what guarantees the deadline, so the floor cannot cause a miss. A floor of 1 is
the paper's greedy policy with a safety net; benchmarks/spot-results.md compares the default
floor with plain Uniform Progress and with greedy on the real traces.

``choose_capacity`` is pure: production calls it at each launch or retry of a partition's run
(spot availability unknown there, so ``spot_available=None``), and ``nightshift simulate``
calls the same function at every step of a real spot trace. Times are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

SPOT = "spot"
ON_DEMAND = "on_demand"
# No node held: before the first launch, or after spot capacity was taken back.
IDLE = "idle"
CAPACITIES = (SPOT, ON_DEMAND, IDLE)
# Chosen on the 2-month traces, checked on the others (benchmarks/spot-results.md).
DEFAULT_MIN_PACE = 0.8

# Which rule decided; a run tag or a metadata value can carry it.
CANNOT_MAKE_IT = "cannot_make_it"
COUNT_BOUND = "count_bound"
EXPLOIT = "stay_on_spot"
SAFETY_NET = "safety_net"
HYSTERESIS = "hysteresis"
BEHIND = "behind_schedule"
TAKING_RISKS = "spot_while_behind"
LEAVE_ON_DEMAND = "ahead_again"
AHEAD = "on_schedule"


@dataclass(frozen=True, slots=True)
class CapacityDecision:
    """The capacity for the next stretch of work, which rule chose it, and what it knew."""

    capacity: str
    rule: str
    cannot_make_it: bool
    work_left_s: float
    time_left_s: float
    deadline: str
    interruptions: int = 0

    @property
    def on_demand(self) -> bool:
        return self.capacity == ON_DEMAND

    @property
    def reason(self) -> str:
        """One line for a run tag, a log and a day's metadata, e.g. ``on-demand: about 2.1 h
        of work left, 1.8 h to 07:00``."""
        what = "on-demand" if self.on_demand else "spot"
        if self.cannot_make_it:
            what += f", and {self.deadline} cannot be met even so"
        facts = f"about {_span(self.work_left_s)} of work left, "
        if self.time_left_s >= 0:
            facts += f"{_span(self.time_left_s)} to {self.deadline}"
        else:
            facts += f"{self.deadline} passed {_span(-self.time_left_s)} ago"
        why = _WHY[self.rule]
        if self.rule == COUNT_BOUND:
            why = why.format(n=self.interruptions)
        return f"{what}: {facts} ({why})"


_WHY = {
    CANNOT_MAKE_IT: "the work left is more than the time left",
    COUNT_BOUND: "{n} interruptions reached on_demand_after",
    EXPLOIT: "staying on the spot node until it is taken back",
    SAFETY_NET: "too close to the deadline to survive another reclaim",
    HYSTERESIS: "catching up with the uniform schedule before going back to spot",
    BEHIND: "behind a uniform schedule to the deadline",
    TAKING_RISKS: "behind schedule, but spot is available now",
    LEAVE_ON_DEMAND: "ahead of the schedule again",
    AHEAD: "on or ahead of a uniform schedule to the deadline",
}


def choose_capacity(
    *,
    work_left_s: float,
    time_left_s: float,
    total_work_s: float,
    window_s: float,
    restart_overhead_s: float,
    current: str = IDLE,
    spot_available: bool | None = None,
    interruptions: int = 0,
    on_demand_after: int | None = None,
    deadline: str = "the deadline",
    min_pace: float = DEFAULT_MIN_PACE,
) -> CapacityDecision:
    """Spot or on-demand for the next stretch of a night's job.

    Args:
        work_left_s: node-seconds of work not yet committed (rows left / recent rows per second).
        time_left_s: seconds from now to the deadline.
        total_work_s: node-seconds of the whole job, as planned when it landed (C0).
        window_s: seconds from landing to the deadline (R0); with ``total_work_s`` it sets the
            uniform schedule.
        restart_overhead_s: seconds from a launch to the first useful work (d).
        current: ``spot`` or ``on_demand`` while a node runs the job, ``idle`` otherwise.
        spot_available: whether spot capacity is there now; ``None`` where it is not known
            (a launch on ECS), which makes a job behind schedule go on-demand.
        interruptions: how many times this job's runs were interrupted so far.
        on_demand_after: the count-based switch's threshold; ``None`` turns it off.
        deadline: how the deadline reads in the reason, e.g. ``07:00``.
        min_pace: the pace floor (fraction of wall time the job must be running to stay on
            schedule); 0 is plain Uniform Progress.

    Returns:
        The decision; its ``reason`` says why in one line.
    """
    _check(work_left_s, time_left_s, total_work_s, window_s, restart_overhead_s, min_pace, current)
    d = restart_overhead_s

    def decide(capacity: str, rule: str, late: bool = False) -> CapacityDecision:
        return CapacityDecision(
            capacity, rule, late, work_left_s, time_left_s, deadline, interruptions
        )

    start = 0.0 if current == ON_DEMAND else d
    if time_left_s < work_left_s + start:
        return decide(SPOT if current == SPOT else ON_DEMAND, CANNOT_MAKE_IT, late=True)
    if on_demand_after is not None and interruptions >= on_demand_after:
        return decide(ON_DEMAND, COUNT_BOUND)
    if current == SPOT:
        return decide(SPOT, EXPLOIT)
    if time_left_s < work_left_s + 2 * d:
        return decide(ON_DEMAND, SAFETY_NET)
    # cp(t) < ep(t) reads C > R * pace: the rate still needed exceeds the planned one. The
    # tolerance keeps "on schedule" on schedule when C and R * pace differ by a rounding.
    pace = max(total_work_s / window_s, min_pace)
    if current == ON_DEMAND:
        if work_left_s > (time_left_s - 2 * d) * pace + _TIE or spot_available is False:
            return decide(ON_DEMAND, HYSTERESIS)
        return decide(SPOT, LEAVE_ON_DEMAND)
    if work_left_s > time_left_s * pace + _TIE:
        if spot_available:
            return decide(SPOT, TAKING_RISKS)
        return decide(ON_DEMAND, BEHIND)
    return decide(SPOT, AHEAD)


_TIE = 1e-6


def work_seconds(rows_left: int, rows_per_second: float) -> float:
    """Node-seconds of work left at a measured rate (recent days of the same asset)."""
    if rows_left < 0:
        raise ValueError(f"rows_left must be >= 0, got {rows_left}")
    if not rows_per_second > 0:
        raise ValueError(f"rows_per_second must be > 0, got {rows_per_second}")
    return rows_left / rows_per_second


def _check(
    work: float, time_left: float, total: float, window: float, d: float, pace: float, current: str
) -> None:
    if current not in CAPACITIES:
        raise ValueError(f"current capacity must be one of {CAPACITIES}, got {current!r}")
    if not work > 0:
        raise ValueError(f"work_left_s must be > 0 (a finished job needs no capacity), got {work}")
    if not total >= work:
        raise ValueError(f"total_work_s ({total}) must be >= work_left_s ({work})")
    if not window > 0:
        raise ValueError(f"window_s must be > 0, got {window}")
    if d < 0:
        raise ValueError(f"restart_overhead_s must be >= 0, got {d}")
    if not 0 <= pace <= 1:
        raise ValueError(f"min_pace must be in [0, 1], got {pace}")
    if time_left != time_left:  # NaN compares unequal to itself
        raise ValueError("time_left_s is NaN")


def _span(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
