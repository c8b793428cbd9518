"""Many nights over each trace, for every policy and setting, summed into per-trace records.

A night is a nightly job: work of ``fraction`` x the window on one node, landing at 01:00,
deadline 07:00 (a 6-hour window), restart overhead d. Nights start every ``stride_hours``
from a trace's first tick (the traces carry no wall-clock time, so "01:00" is the start of
each window). Costs are at one node type's prices (policy/prices.json).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from orchestration.simulate.optimum import optimum_costs
from orchestration.simulate.replay import (
    Job,
    Outcome,
    always_on_demand,
    always_spot,
    count_based,
    deadline_aware,
    replay,
)
from orchestration.simulate.traces import Trace, nights, resample
from policy.deadline import DEFAULT_MIN_PACE
from policy.prices import NodePrices

POLICIES = (
    "on-demand",
    "greedy-spot",
    "count-switch",
    "uniform-progress",
    "deadline-aware",
    "optimum",
)
STEP_SECONDS = 60.0


@dataclass(frozen=True)
class Settings:
    """What to sweep and how a night looks."""

    fractions: Sequence[float] = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    overhead_minutes: Sequence[float] = (2.0, 10.0)
    window_hours: float = 6.0
    stride_hours: float = 24.0
    on_demand_after: int = 2
    deadline_on_demand_after: int | None = None
    min_pace: float = DEFAULT_MIN_PACE
    hop_back: bool = True
    deadline: str = "07:00"
    nodes: int = 1


@dataclass
class Tally:
    """Sums over nights for one policy on one trace (or in all)."""

    nights: int = 0
    misses: int = 0
    misses_on_demand_met: int = 0
    cost: float = 0.0
    optimum_cost: float = 0.0
    on_demand_cost: float = 0.0
    interruptions: int = 0
    late_steps: int = 0
    spot_steps: int = 0
    on_demand_steps: int = 0
    by_setting: dict[str, list[tuple[float, bool]]] = field(default_factory=dict)

    def add(self, cost: float, opt: float, od: float, out: Outcome | None, od_met: bool):
        self.nights += 1
        self.cost += float(cost)
        self.optimum_cost += float(opt)
        self.on_demand_cost += float(od)
        if out is not None:
            self.misses += not out.met
            self.misses_on_demand_met += (not out.met) and od_met
            self.interruptions += out.interruptions
            self.late_steps += out.late_steps
            self.spot_steps += out.spot_steps
            self.on_demand_steps += out.on_demand_steps


def simulate_trace(
    trace: Trace, prices: NodePrices, settings: Settings = Settings()
) -> dict[str, Tally]:
    """Every policy over every night of one trace, for every fraction and overhead."""
    steps = resample(trace.available(settings.nodes), trace.gap_seconds, STEP_SECONDS)
    length = round(settings.window_hours * 3600 / STEP_SECONDS)
    stride = round(settings.stride_hours * 3600 / STEP_SECONDS)
    windows = nights(steps, length, stride)
    per_step = STEP_SECONDS / 3600
    spot_price, od_price = prices.spot_per_hour * per_step, prices.on_demand_per_hour * per_step
    tallies = {name: Tally() for name in POLICIES}
    for fraction, minutes in _settings(settings):
        overhead = round(minutes * 60 / STEP_SECONDS)
        job = Job(round(fraction * length), length, overhead, STEP_SECONDS, settings.deadline)
        if job.work + job.overhead > job.length or len(windows) == 0:
            continue
        policies = {
            "on-demand": always_on_demand(),
            "greedy-spot": always_spot(),
            "count-switch": count_based(settings.on_demand_after),
            "uniform-progress": deadline_aware(
                job, settings.deadline_on_demand_after, 0.0, settings.hop_back
            ),
            "deadline-aware": deadline_aware(
                job, settings.deadline_on_demand_after, settings.min_pace, settings.hop_back
            ),
        }
        best = optimum_costs(job, windows, spot_price, od_price)
        key = f"{fraction:g}/{minutes:g}"
        for night, opt in zip(windows, best, strict=True):
            outcomes = {name: replay(job, night, p) for name, p in policies.items()}
            od_out = outcomes["on-demand"]
            od_cost = od_out.on_demand_steps * od_price
            for name, out in outcomes.items():
                cost = out.spot_steps * spot_price + out.on_demand_steps * od_price
                tallies[name].add(cost, opt, od_cost, out, od_out.met)
                tallies[name].by_setting.setdefault(key, []).append(
                    (float(cost / opt), not out.met)
                )
            tallies["optimum"].add(opt, opt, od_cost, None, od_out.met)
            tallies["optimum"].by_setting.setdefault(key, []).append((1.0, False))
    return tallies


def _settings(settings: Settings) -> Iterable[tuple[float, float]]:
    for fraction in settings.fractions:
        if not 0 < fraction <= 1:
            raise ValueError(f"work/slack fraction must be in (0, 1], got {fraction}")
        for minutes in settings.overhead_minutes:
            if minutes < 0:
                raise ValueError(f"restart overhead must be >= 0 minutes, got {minutes}")
            yield fraction, minutes


def records(per_trace: dict[str, dict[str, Tally]], prices: NodePrices) -> list[dict]:
    """One record per policy and trace, then one per policy for all traces together
    (``cost_vs_optimum`` there is the mean of the traces' ratios)."""
    out = []
    for trace, tallies in per_trace.items():
        for policy, tally in tallies.items():
            if tally.nights:
                out.append(_record(policy, trace, tally, prices))
    for policy in POLICIES:
        rows = [r for r in out if r["policy"] == policy]
        if not rows:
            continue
        total = Tally()
        for trace in per_trace:
            t = per_trace[trace][policy]
            for name in ("nights", "misses", "misses_on_demand_met", "interruptions"):
                setattr(total, name, getattr(total, name) + getattr(t, name))
            total.cost += t.cost
            total.optimum_cost += t.optimum_cost
            total.on_demand_cost += t.on_demand_cost
            total.late_steps += t.late_steps
        row = _record(policy, "all", total, prices)
        row["traces"] = len(rows)
        row["cost_vs_optimum"] = round(float(np.mean([r["cost_vs_optimum"] for r in rows])), 4)
        row["worst_trace_cost_vs_optimum"] = max(r["cost_vs_optimum"] for r in rows)
        out.append(row)
    return out


def _record(policy: str, trace: str, t: Tally, prices: NodePrices) -> dict:
    misses = t.misses
    return {
        "policy": policy,
        "trace": trace,
        "nights": t.nights,
        "misses": misses,
        "misses_on_demand_met": t.misses_on_demand_met,
        "usd_per_night": round(float(t.cost / t.nights), 4),
        "cost_vs_optimum": round(float(t.cost / t.optimum_cost), 4),
        "saving_vs_on_demand": round(float(1 - t.cost / t.on_demand_cost), 4),
        "interruptions_per_night": round(t.interruptions / t.nights, 3),
        "mean_minutes_late_when_missed": round(t.late_steps * STEP_SECONDS / 60 / misses, 1)
        if misses
        else 0.0,
        "prices": prices.label,
    }


def by_setting(per_trace: dict[str, dict[str, Tally]]) -> list[dict]:
    """Misses and mean cost/optimum per policy and setting (fraction/overhead), all nights."""
    rows = []
    for policy in POLICIES:
        merged: dict[str, list[tuple[float, bool]]] = {}
        for tallies in per_trace.values():
            for key, nights_ in tallies[policy].by_setting.items():
                merged.setdefault(key, []).extend(nights_)
        for key, nights_ in merged.items():
            fraction, minutes = key.split("/")
            ratios = [r for r, _ in nights_]
            rows.append(
                {
                    "policy": policy,
                    "fraction": float(fraction),
                    "overhead_minutes": float(minutes),
                    "nights": len(nights_),
                    "misses": sum(m for _, m in nights_),
                    "mean_cost_vs_optimum": round(float(np.mean(ratios)), 4),
                }
            )
    return rows
