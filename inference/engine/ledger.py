"""What a scored partition cost, over all of its attempts: the cost ledger.

Every attempt at a partition (a run, or a run's retry after an interruption, on whichever
capacity it was launched) adds one entry to ``outputs/<asset>/_ledger/date=D.json``, beside the
partition's lease: when its node started (the run's launch, for the first partition a run
scores), when scoring began, when it ended, the rows it read, the rows it redid, and its
capacity, and its share of its run's start-up. The entry is saved when the attempt starts, after
each shard and when it ends, so an attempt killed without notice still counts up to its last
shard. The day's commit closes the ledger; the next scoring of the same day (a new model, new
landing files) opens a new one. An entry also traces its process (inference/engine/oom_killed.py),
so the next attempt can tell one the kernel's OOM killer took.

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

No Dagster here: the scoring engine (assets/checkpointing.py) records through :class:`RunLedger`,
tests read the files.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

import pyarrow.fs as pafs

from inference.engine.oom_killed import ProcessTrace, oom_killed
from inference.engine.output_partition import PartitionIO, PartitionTarget, ShardReport
from inference.engine.shard_writer import ShardedWriter
from policy.prices import NodePrices
from policy.ready_by import NightFacts, ready_by

SPOT, ON_DEMAND = "spot", "on_demand"
LEDGER_DIR = "_ledger"
KILL_NOTE_SUFFIX = ".killed"
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
    stalled_s: float = 0.0  # seconds the progress watchdog waited for a stuck model call
    # The attempt's own process, for the next attempt to tell an OOM kill (oom_killed.py).
    process: ProcessTrace | None = None
    # The backstop's line, where it killed this attempt (inference/engine/backstop.py); told
    # by the next attempt, which read the kill note.
    killed: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.process, dict):  # as read back from the ledger's file
            self.process = ProcessTrace(**self.process)

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
        figures: dict[str, float | int | str] = {
            "cost_usd": round(cost, 6),
            "cost_on_demand_usd": round(all_on_demand, 6),
            "cost_rework_usd": round(lost, 6),
            "saving_pct": round(saving, 1),
            "node_s_spot": round(spot_s, 3),
            "node_s_on_demand": round(on_demand_s, 3),
            "rework_s": round(self.rework_s, 3),
            "attempts_billed": len(self.attempts),
            "cost_basis": prices.label,
            "stalled_s": round(sum(a.stalled_s for a in self.attempts), 1),
        }
        killed = [a.killed for a in self.attempts if a.killed]
        if killed:
            figures["stall_killed"] = killed[-1]
        return figures

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


def kill_note_path(target: PartitionTarget) -> str:
    """``outputs/<asset>/_ledger/date=D.killed``: where the backstop process says it killed an
    attempt at the day (not ``.json``: the ledger's readers list those)."""
    return ledger_path(target).removesuffix(".json") + KILL_NOTE_SUFFIX


class LedgerBook:
    """Reads and writes one partition's ledger, and the asset's recent days' ledgers."""

    def __init__(self, target: PartitionTarget, asset: str, date: str):
        self.target, self.asset, self.date = target, asset, date
        self.closed_stored = False  # whether open() found the day's ledger closed by a commit
        self.path = ledger_path(target)
        self.io = PartitionIO(target)

    def open(self) -> PartitionLedger:
        """The open ledger of this day: the stored one, or a new one once a commit closed it."""
        stored = self.io.read_json(self.path)
        self.closed_stored = bool(stored and stored.get("committed"))
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


@dataclass
class OpenDay:
    """The partition being scored now: its writer, its ledger and this attempt's entry."""

    asset: str
    date: str
    writer: ShardedWriter
    book: LedgerBook
    ledger: PartitionLedger
    attempt: Attempt
    # Whether the ledger file is ours to write: not while a committed day's ledger is stored
    # and this attempt has scored nothing (the day may turn out committed by this lineage).
    saving: bool

    def rows_done(self) -> int:
        """Input rows in the shards finished so far, by this attempt or earlier ones."""
        return sum(int(e["rows_in"]) for e in self.writer.progress.shards.values())

    def save(self) -> None:
        self.attempt.ended = time.time()
        if self.attempt.process is not None:
            self.attempt.process.seen()
        self.attempt.rows_redone = self.writer.report.rows_redone
        if self.saving:
            self.book.save(self.ledger)

    def take_kill_note(self) -> dict | None:
        """The backstop's note that it killed an earlier attempt (its line, shard, batches and
        wait), entered in that attempt as a stall the capacity policy counts, and removed;
        None where there is none."""
        path = kill_note_path(self.writer.target)
        try:
            note = self.book.io.read_json(path)
        except ValueError:  # cut short: the kill still happened
            note = {"line": f"killed by the watchdog's backstop; its note was unreadable: {path}"}
        if note is None:
            return None
        waited, at = float(note.get("waited_s", 0.0)), float(note.get("killed_at", time.time()))
        run_id = str(note.get("run_id", ""))
        earlier = [a for a in self.ledger.attempts[:-1] if a.run_id == run_id]
        if earlier:
            killed = earlier[-1]
        else:  # killed before its first shard, so before its entry was first saved
            killed = Attempt(run_id, str(note.get("capacity") or self.attempt.capacity), at, at, at)
            self.ledger.attempts.insert(len(self.ledger.attempts) - 1, killed)
        killed.ended = max(killed.ended, at)  # its node ran on, stuck, until the kill
        killed.interrupted = True
        killed.stalled_s += waited
        killed.killed = str(note["line"])
        self.saving = True
        self.save()
        self.writer.target.fs.delete_file(path)
        return note

    def night_facts(
        self, interruptions: int, current: str, tags: Mapping[str, str], on_demand_after: int
    ) -> NightFacts:
        """What the capacity policy is told about the day: rows left, the asset's recent rate
        and restart overhead (this day's own before any day was committed), its ready-by (from
        the run's ``tags`` or the settings), and the time its attempts lost to stalls."""
        recent = self.book.recent()
        rate = recent_rate(recent) or self.ledger.rows_per_second()
        overheads = [o for x in (self.ledger, *recent) if (o := x.restart_overhead_s())]
        totals = [x.rows_total for x in recent if x.rows_total]
        total = self.ledger.rows_total or (round(sum(totals) / len(totals)) if totals else None)
        return NightFacts(
            rows_left=max((total or 0) - self.rows_done(), 0),
            rows_total=total,
            rows_per_second=rate,
            restart_overhead_s=overheads[0] if overheads else None,
            first_started=self.ledger.attempts[0].started,
            now=time.time(),
            ready=ready_by(self.asset, self.date, tags),
            interruptions=interruptions,
            on_demand_after=on_demand_after,
            current=current,
            stalled_s=sum(a.stalled_s for a in self.ledger.attempts),
        )


class RunLedger:
    """One run's entries in its days' ledgers: the day it scores now, and each committed day's
    figures, priced at ``prices``.

    Args:
        run_id: the attempt's run, entered in each day's ledger.
        capacity: what the run was launched on (spot, on_demand).
        prices: the node type's rates.
        startup: the run's start-up, shared among ``dates`` (the run's days, in the order it
            scores them; empty for a one-day run).
    """

    def __init__(
        self,
        run_id: str,
        capacity: str,
        prices: NodePrices,
        startup: StartupShares,
        dates: list[str],
    ):
        self.run_id, self.capacity, self.prices = run_id, capacity, prices
        self.startup, self._dates = startup, dates
        self.open_day: OpenDay | None = None
        self.days: dict[str, dict] = {}  # each committed day's ledger figures

    def open(
        self, asset: str, date: str, writer: ShardedWriter, rows: int | None, batch_size: int = 0
    ) -> OpenDay:
        """Enters this attempt in the day's ledger.

        Raises:
            OomKilledAttempt: the previous attempt's process was the kernel's OOM killer's; it
                is reported once, and the next launch resumes the day.
        """
        book = LedgerBook(writer.target, asset, date)
        ledger = book.open()
        previous = ledger.attempts[-1] if ledger.attempts else None
        if previous is not None and previous.process is not None:
            fault = oom_killed(previous.process, previous.run_id, writer, f"{asset} {date}")
            if fault is not None:
                previous.process.reported = True
                book.save(ledger)
                raise fault
        now = time.time()
        started, share = self.startup.open(now, self._days_left(date))
        attempt = Attempt(self.run_id, self.capacity, started, now, now, startup_share_s=share)
        attempt.process = ProcessTrace.begin(batch_size)
        ledger.attempts.append(attempt)
        if rows is not None:
            ledger.rows_total = rows
        # Saved before the first shard is handed out (run_day), unless a committed ledger is
        # stored (it may yet turn out this lineage's): a process killed in its first shard
        # leaves its trace for the next attempt.
        day = OpenDay(asset, date, writer, book, ledger, attempt, saving=not book.closed_stored)
        self.open_day = day
        return day

    def _days_left(self, date: str) -> int:
        """This day and the run's days after it: the days what is left of the start-up is
        shared among (the runner scores a range's days in order)."""
        return len(self._dates) - self._dates.index(date) if date in self._dates else 1

    def left(self, day: OpenDay, interrupted: bool) -> None:
        """The run leaves on this day: its later days will not take their start-up shares."""
        day.attempt.startup_share_s = (day.attempt.startup_share_s or 0.0) + self.startup.rest()
        day.attempt.interrupted = interrupted
        if day.attempt.process is not None:
            day.attempt.process.left = True

    def close(self, day: OpenDay, shards: ShardReport) -> None:
        """Closes the day's ledger at its commit and keeps its figures for the metadata."""
        ledger = day.ledger
        if shards.already_committed and not day.saving:
            # Committed and recorded by an earlier attempt: that attempt's ledger holds the day.
            stored = day.book.io.read_json(day.book.path)
            ledger = PartitionLedger.from_json(stored) if stored else ledger
            self.startup.give_back(day.attempt.startup_share_s or 0.0)
        else:
            ledger.rows_total, ledger.committed = shards.rows_in, True
            day.book.save(ledger)
        self.days[day.date] = ledger.figures(self.prices)
        self.open_day = None

    def latest(self) -> dict:
        """The latest committed day's figures (a range run asks after each of its days)."""
        return next(reversed(self.days.values())) if self.days else {}

    def range_line(self) -> str | None:
        """A range run's days added up, in one line; None for fewer than two days."""
        if len(self.days) < 2:
            return None
        total = sum_figures(self.days.values())
        return (
            f"{len(self.days)} days: ${total['cost_usd']:.4f} {self.prices.label} "
            f"(${total['cost_on_demand_usd']:.4f} all on on-demand, saving "
            f"{total['saving_pct']:.0f}%); {total['node_s_spot']:.1f} node-s on spot, "
            f"{total['node_s_on_demand']:.1f} on on-demand, {total['rework_s']:.1f} s of rework "
            f"(${total['cost_rework_usd']:.4f})"
        )
