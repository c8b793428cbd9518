"""The offline optimum: the cheapest schedule that meets the deadline, knowing the whole trace.

Dynamic programming over steps, for many nights at once. The state at the start of a step is
(capacity held, work done). Each step the schedule may idle (free), keep running on its node
(one step of progress at that node's price; spot only while the trace has it), or move onto the
other capacity: a move pays the restart overhead d at the new node's price and lands d steps
later with no progress, and a move onto spot needs spot through the whole overhead (a schedule
that knows the trace never starts a spot node that is taken back before it did any work).
These are the costs :mod:`orchestration.simulate.replay` charges an online policy.
"""

from __future__ import annotations

import numpy as np

from orchestration.simulate.replay import IDLE, ON_DEMAND, SPOT, Job


def optimum_costs(
    job: Job, available: np.ndarray, spot_per_step: float, on_demand_per_step: float
) -> np.ndarray:
    """Least cost of each night that meets the deadline.

    Args:
        job: the night's work, length and restart overhead, in steps.
        available: shape (nights, job.length), spot availability per step.
        spot_per_step: price of one node-step on spot.
        on_demand_per_step: price of one node-step on on-demand.

    Returns:
        Shape (nights,): the least cost; ``inf`` where even on-demand from the start is late.
    """
    nights, length = available.shape
    if length != job.length:
        raise ValueError(f"availability has {length} steps per night, the job {job.length}")
    work, d = job.work, job.overhead
    price = {SPOT: spot_per_step, ON_DEMAND: on_demand_per_step}
    spot_through = _spot_through_overhead(available, d)
    states = (nights, 3, work + 1)
    pending: dict[int, np.ndarray] = {0: np.full(states, np.inf)}
    pending[0][:, IDLE, 0] = 0.0
    for step in range(length):
        cur = pending.pop(step)
        nxt = pending.setdefault(step + 1, np.full(states, np.inf))
        nxt[:, IDLE] = np.minimum(nxt[:, IDLE], cur.min(axis=1))
        has_spot = available[:, step][:, None]
        for mode, other in ((SPOT, ON_DEMAND), (ON_DEMAND, SPOT)):
            run = cur[:, mode] + price[mode]
            start = np.minimum(cur[:, IDLE], cur[:, other])
            if mode == SPOT:
                run = np.where(has_spot, run, np.inf)
            if d == 0:
                moved = start + price[mode]
                if mode == SPOT:
                    moved = np.where(has_spot, moved, np.inf)
                run = np.minimum(run, moved)
            else:
                moved = start + d * price[mode]
                if mode == SPOT:
                    moved = np.where(spot_through[:, step][:, None], moved, np.inf)
                land = pending.setdefault(step + d, np.full(states, np.inf))
                land[:, mode] = np.minimum(land[:, mode], moved)
            _progress(nxt[:, mode], run)
    end = pending[length]
    return end[:, :, work].min(axis=1)


def _progress(into: np.ndarray, run: np.ndarray) -> None:
    """One step of work: ``into[w + 1] = min(into[w + 1], run[w])``, done work capped."""
    np.minimum(into[:, 1:], run[:, :-1], out=into[:, 1:])
    np.minimum(into[:, -1], run[:, -1], out=into[:, -1])


def _spot_through_overhead(available: np.ndarray, d: int) -> np.ndarray:
    """Whether spot is there for all of steps s .. s + d - 1 (False past the night's end)."""
    nights, length = available.shape
    if d == 0:
        return available.copy()
    missing = np.concatenate(
        [np.zeros((nights, 1), dtype=np.int64), np.cumsum(~available, axis=1)], axis=1
    )
    ok = np.zeros_like(available)
    span = length - d + 1
    if span > 0:
        ok[:, :span] = (missing[:, d : d + span] - missing[:, :span]) == 0
    return ok
