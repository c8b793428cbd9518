"""One night of a nightly job replayed on a spot availability trace, under an online policy.

Time moves in steps of ``step_seconds``. At each step the policy sees the clock, the work done,
the capacity the job holds (spot, on-demand, or none) and whether spot is there, and asks for a
capacity. Spot is taken back when the trace says it is gone. Every move onto a node costs the
restart overhead d (launch to first useful work), paid at that node's price, as in the
"Can't Be Late" model. A job that has not finished at the deadline is a miss; it then finishes
on on-demand, so a policy cannot look cheap by leaving work undone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from policy import deadline as dl
from policy.capacity import capacity_tags
from policy.tags import CAPACITY_TAG

IDLE, SPOT, ON_DEMAND = 0, 1, 2
CAPACITY_NAMES = {IDLE: dl.IDLE, SPOT: dl.SPOT, ON_DEMAND: dl.ON_DEMAND}

# A policy: (step, work done, capacity held, spot available, interruptions) -> capacity wanted.
Policy = Callable[[int, int, int, bool, int], int]


@dataclass(frozen=True)
class Job:
    """A night's job in steps: ``work`` of useful node time within ``length`` steps."""

    work: int
    length: int
    overhead: int
    step_seconds: float
    deadline: str = "07:00"

    def __post_init__(self):
        if not 0 < self.work <= self.length:
            raise ValueError(f"work must be in 1..{self.length} steps, got {self.work}")
        if self.overhead < 0:
            raise ValueError(f"overhead must be >= 0 steps, got {self.overhead}")


@dataclass(frozen=True)
class Outcome:
    """What a night cost, in node-steps on each capacity, and whether it met the deadline."""

    spot_steps: int
    on_demand_steps: int
    met: bool
    late_steps: int
    interruptions: int


def replay(job: Job, available: np.ndarray, policy: Policy) -> Outcome:
    """Runs ``policy`` over one night's availability (one bool per step)."""
    mode, overhead_left, done, interruptions = IDLE, 0, 0, 0
    used = [0, 0, 0]
    for step in range(job.length):
        if done >= job.work:
            break
        spot = bool(available[step])
        if mode == SPOT and not spot:
            mode, overhead_left = IDLE, 0
            interruptions += 1
        want = policy(step, done, mode, spot, interruptions)
        if want == SPOT and not spot:
            want = IDLE  # a spot request waits for capacity
        if want != mode:
            overhead_left = job.overhead if want != IDLE else 0
            mode = want
        if mode == IDLE:
            continue
        used[mode] += 1
        if overhead_left:
            overhead_left -= 1
        else:
            done += 1
    late = 0
    if done < job.work:
        late = job.work - done + (overhead_left if mode == ON_DEMAND else job.overhead)
        used[ON_DEMAND] += late
    return Outcome(used[SPOT], used[ON_DEMAND], late == 0, late, interruptions)


def always_on_demand() -> Policy:
    return lambda step, done, mode, spot, interruptions: ON_DEMAND


def always_spot() -> Policy:
    """Greedy spot: take spot whenever it is there and wait when it is not."""
    return lambda step, done, mode, spot, interruptions: SPOT


def count_based(on_demand_after: int) -> Policy:
    """Today's switch: spot until ``on_demand_after`` interruptions, then on-demand. It asks
    ``policy.capacity.capacity_tags`` itself, the function the interruption path calls."""
    moved: dict[int, bool] = {}

    def policy(step: int, done: int, mode: int, spot: bool, interruptions: int) -> int:
        if interruptions not in moved:
            moved[interruptions] = CAPACITY_TAG in capacity_tags(interruptions, on_demand_after)
        return ON_DEMAND if moved[interruptions] else SPOT

    return policy


def deadline_aware(
    job: Job,
    on_demand_after: int | None = None,
    min_pace: float = dl.DEFAULT_MIN_PACE,
    hop_back: bool = True,
) -> Policy:
    """The deadline-aware policy: ``policy.deadline.choose_capacity`` at every step
    (``min_pace=0`` is plain Uniform Progress). Without ``hop_back`` a job on on-demand keeps
    its node to the end, as when production asks the policy only at launches and retries."""
    s = job.step_seconds
    total, window, overhead = job.work * s, job.length * s, job.overhead * s
    choose = dl.choose_capacity
    codes = {dl.SPOT: SPOT, dl.ON_DEMAND: ON_DEMAND}
    names = CAPACITY_NAMES

    def policy(step: int, done: int, mode: int, spot: bool, interruptions: int) -> int:
        if mode == ON_DEMAND and not hop_back:
            return ON_DEMAND
        decision = choose(
            work_left_s=(job.work - done) * s,
            time_left_s=(job.length - step) * s,
            total_work_s=total,
            window_s=window,
            restart_overhead_s=overhead,
            current=names[mode],
            spot_available=spot,
            interruptions=interruptions,
            on_demand_after=on_demand_after,
            deadline=job.deadline,
            min_pace=min_pace,
        )
        return codes[decision.capacity]

    return policy
