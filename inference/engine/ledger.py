"""What a scored partition cost, over all of its attempts: the cost ledger.

Every attempt at a partition (a run, or a run's retry after an interruption, on whichever
capacity it was launched) adds one entry to ``outputs/<asset>/_ledger/date=D.json``, beside the
partition's lease: when its node started (the run's launch, for the first partition a run
scores), when scoring began, when it ended, the rows it read, the rows it redid, and its
capacity, and its share of its run's start-up. The entry is saved when the attempt starts, after
each shard and when it ends, so an attempt killed without notice still counts up to its last
shard. The day's commit closes the ledger; the next scoring of the same day (a new model, new
landing files) opens a new one.

A run's start-up (launch to the first shard of the first day it scores: process start, model
load) is that day's restart overhead, the figure the capacity policy reads. Its cost is shared:
each day the run scores is priced at an even share of it (:class:`StartupShares`), so a range
backfill's first day does not carry the whole start-up, and the range's total is unchanged.

From the entries, priced at a node type's spot and on-demand rates (``policy.prices``):

- node-seconds on spot and on on-demand: each attempt's scoring plus its start-up share;
- rework: seconds spent on rows redone after an interruption (the rows an attempt redid, at
  that attempt's own rate), plus the start-up share of every attempt after the first (the
  restart an interruption caused);
- $ spent, $ had every attempt run on on-demand, $ lost to rework, and the saving in %.

The ledger of the asset's recent committed days also gives the rate (rows per node-second of
scoring) that the deadline-aware capacity policy turns rows left into work left with.

No Dagster here: the scoring engine (assets/checkpointing.py) records, tests read the files.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import pyarrow.fs as pafs

from inference.engine.output_partition import PartitionIO, PartitionTarget
from policy.prices import NodePrices

SPOT, ON_DEMAND = "spot", "on_demand"
LEDGER_DIR = "_ledger"
# Recent committed days whose rate the policy reads.
RECENT_DAYS = 7


@dataclass
class Attempt:
    """One attempt's node time at a partition (epoch seconds).

    ``started`` is the run's launch for the first day the run scores, else when the day opened;
    ``startup_share_s`` is the part of the run's start-up this day is priced at. None in
    ledgers written before start-ups were shared: the attempt is priced at its own overhead.
    """

    run_id: str
    capacity: str
    started: float
    work_started: float
    ended: float
    rows: int = 0
    rows_redone: int = 0
    interrupted: bool = False
    startup_share_s: float | None = None

    @property
    def node_s(self) -> float:
        return max(self.ended - self.started, 0.0)

    @property
    def overhead_s(self) -> float:
        """Launch to first shard: the node was paid for, nothing was scored yet. The whole
        start-up, on the first day a run scores: what the capacity policy reads."""
        return max(self.work_started - self.started, 0.0)

    @property
    def startup_priced_s(self) -> float:
        """The start-up node-seconds this day is priced at."""
        return self.overhead_s if self.startup_share_s is None else self.startup_share_s

    @property
    def priced_s(self) -> float:
        """The node-seconds this day is priced at: its scoring and its start-up share."""
        return self.work_s + self.startup_priced_s

    @property
    def work_s(self) -> float:
        return max(self.ended - self.work_started, 0.0)

    @property
    def redo_s(self) -> float:
        """Seconds this attempt spent on rows an earlier attempt had already computed."""
        if self.rows <= 0 or self.rows_redone <= 0:
            return 0.0
        return self.work_s * min(self.rows_redone, self.rows) / self.rows


@dataclass
class PartitionLedger:
    """The attempts at one partition since it was last committed."""

    asset: str
    date: str
    attempts: list[Attempt] = field(default_factory=list)
    rows_total: int | None = None
    committed: bool = False

    @property
    def rework_s(self) -> float:
        restarts = sum(a.startup_priced_s for a in self.attempts[1:])
        return sum(a.redo_s for a in self.attempts) + restarts

    def node_s(self, capacity: str) -> float:
        """The node-seconds the day is priced at on ``capacity``, start-up shares included."""
        return sum(a.priced_s for a in self.attempts if a.capacity == capacity)

    def rows_per_second(self) -> float | None:
        """Rows read per second of scoring over the attempts, or None before any shard."""
        work = sum(a.work_s for a in self.attempts if a.rows > 0)
        rows = sum(a.rows for a in self.attempts)
        return rows / work if work > 0 and rows > 0 else None

    def restart_overhead_s(self) -> float | None:
        """The mean launch-to-first-shard of the attempts that started a run's node."""
        overheads = [a.overhead_s for a in self.attempts if a.overhead_s > 0]
        return sum(overheads) / len(overheads) if overheads else None

    def figures(self, prices: NodePrices) -> dict[str, float | int | str]:
        """The day's cost figures: node-seconds, rework, $ spent, $ on on-demand, $ lost to
        rework and the saving of spot in %, captioned with the prices used."""
        rate = {SPOT: prices.spot_per_hour / 3600, ON_DEMAND: prices.on_demand_per_hour / 3600}
        spot_s, on_demand_s = self.node_s(SPOT), self.node_s(ON_DEMAND)
        cost = spot_s * rate[SPOT] + on_demand_s * rate[ON_DEMAND]
        all_on_demand = (spot_s + on_demand_s) * rate[ON_DEMAND]
        lost = sum(a.redo_s * rate[a.capacity] for a in self.attempts)
        lost += sum(a.startup_priced_s * rate[a.capacity] for a in self.attempts[1:])
        saving = 100 * (all_on_demand - cost) / all_on_demand if all_on_demand > 0 else 0.0
        return {
            "cost_usd": round(cost, 6),
            "cost_on_demand_usd": round(all_on_demand, 6),
            "cost_rework_usd": round(lost, 6),
            "saving_pct": round(saving, 1),
            "node_s_spot": round(spot_s, 3),
            "node_s_on_demand": round(on_demand_s, 3),
            "rework_s": round(self.rework_s, 3),
            "attempts_billed": len(self.attempts),
            "cost_basis": prices.label,
        }

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> PartitionLedger:
        attempts = [Attempt(**a) for a in data.get("attempts", [])]
        return cls(data["asset"], data["date"], attempts, data.get("rows_total"), data["committed"])


@dataclass
class StartupShares:
    """A run's start-up, priced in even shares to the days the run scores.

    The start-up is known when the first day opens (launch to that day's first work). Each
    day that opens takes an even share of what is left among the run's days left, itself
    included; the day the run leaves on early (an interruption, an error) takes all that is
    left. The shares of the days a run records therefore add up to its start-up.
    """

    launched: float | None  # None: no start-up to price (a step retried on the same node)
    seconds: float | None = None
    charged: float = 0.0
    days: int = 0

    def open(self, now: float, days_left: int) -> tuple[float, float]:
        """The opening day's node start and start-up share: the launch for the first day the
        run scores, else ``now``; ``days_left`` counts this day and the run's days after it."""
        if self.launched is None:
            return now, 0.0
        started = now
        if self.days == 0:
            started, self.seconds, self.charged = self.launched, max(now - self.launched, 0.0), 0.0
        share = (self.seconds - self.charged) / max(days_left, 1)
        self.charged += share
        self.days += 1
        return started, share

    def rest(self) -> float:
        """What is left of the start-up, taken by the day the run leaves on."""
        if self.seconds is None:
            return 0.0
        left, self.charged = self.seconds - self.charged, self.seconds
        return left

    def give_back(self, share: float) -> None:
        """A day that records nothing (an earlier attempt of the run's lineage committed it)
        returns its share to the days after it; with no day recorded yet, the start-up runs
        on to the next day's first work."""
        if self.launched is None:
            return
        self.charged -= share
        self.days -= 1


def ledger_path(target: PartitionTarget) -> str:
    """``outputs/<asset>/_ledger/date=D.json``: beside the leases, under a folder that
    Hive-style readers of the output skip (it starts with an underscore)."""
    asset_dir = posixpath.dirname(posixpath.dirname(target.lease_path))
    return f"{asset_dir}/{LEDGER_DIR}/{posixpath.basename(target.lease_path)}"


class LedgerBook:
    """Reads and writes one partition's ledger, and the asset's recent days' ledgers."""

    def __init__(self, target: PartitionTarget, asset: str, date: str):
        self.target, self.asset, self.date = target, asset, date
        self.path = ledger_path(target)
        self.io = PartitionIO(target)

    def open(self) -> PartitionLedger:
        """The open ledger of this day: the stored one, or a new one once a commit closed it."""
        stored = self.io.read_json(self.path)
        if stored is None or stored.get("committed"):
            return PartitionLedger(self.asset, self.date)
        return PartitionLedger.from_json(stored)

    def save(self, ledger: PartitionLedger) -> None:
        self.target.fs.create_dir(posixpath.dirname(self.path), recursive=True)
        self.io.write_json(self.path, ledger.to_json())

    def recent(self, days: int = RECENT_DAYS) -> list[PartitionLedger]:
        """The committed ledgers of the asset's latest ``days`` days before this one."""
        folder = posixpath.dirname(self.path)
        selector = pafs.FileSelector(folder, allow_not_found=True)
        names = sorted(
            info.path
            for info in self.target.fs.get_file_info(selector)
            if info.path.endswith(".json") and posixpath.basename(info.path) < f"date={self.date}"
        )
        ledgers = []
        for path in reversed(names):
            data = self.io.read_json(path)
            if data and data.get("committed"):
                ledgers.append(PartitionLedger.from_json(data))
            if len(ledgers) == days:
                break
        return ledgers


def recent_rate(ledgers: Iterable[PartitionLedger]) -> float | None:
    """Rows per second of scoring over the given days together, or None without any."""
    rows = work = 0.0
    for ledger in ledgers:
        for a in ledger.attempts:
            if a.rows > 0:
                rows, work = rows + a.rows, work + a.work_s
    return rows / work if rows > 0 and work > 0 else None


def sum_figures(figures: Iterable[dict]) -> dict[str, float]:
    """A range's totals from its days' figures: node-seconds, rework and $ add up, and the
    saving is recomputed from the sums."""
    keys = (
        "cost_usd",
        "cost_on_demand_usd",
        "cost_rework_usd",
        "node_s_spot",
        "node_s_on_demand",
        "rework_s",
    )
    total = {key: 0.0 for key in keys}
    for day in figures:
        for key in keys:
            total[key] += float(day.get(key, 0.0))
    on_demand = total["cost_on_demand_usd"]
    total["saving_pct"] = 100 * (on_demand - total["cost_usd"]) / on_demand if on_demand else 0.0
    return total
