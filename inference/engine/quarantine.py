"""Quarantine: rows that cannot be scored are set aside with a reason, never dropped or guessed.

A domain screens a whole partition before any inference (:class:`Screener`), marking rows by
their position in the partition's deterministic input order, each with one reason. The engine
then splits every batch into rows to score and rows to quarantine (:meth:`QuarantinePlan.split`).
Positions are fixed by the input, so a retry that resumes from a checkpoint sets aside exactly
the same rows, and ``rows in = rows scored + rows quarantined`` holds shard by shard.

A quarantined row keeps its input columns, its ``row_number`` across the whole partition and its
``reason``; a plan told which files its rows come from (:meth:`QuarantinePlan.located`) also
names the row's ``source_file`` and its ``source_row_number`` there, so it can be found.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROW_NUMBER = "row_number"
REASON = "reason"
SOURCE_FILE = "source_file"
SOURCE_ROW_NUMBER = "source_row_number"


@dataclass(frozen=True)
class QuarantineLimit:
    """How many of a day's rows may be quarantined before the day fails and publishes nothing.

    The day fails when more rows are quarantined than the larger of ``rate`` x rows and
    ``floor_rows``. The share alone would fail a small day on a single row (1 of 29 is 3.45%);
    the floor lets a few bad rows be set aside whatever the day's size. The floor never covers
    more than half a day: when most of a day cannot be scored the feed is broken, and
    publishing what is left would hide it.

    Attributes:
        rate: the share of a day's rows that may be quarantined, in [0, 1].
        floor_rows: rows any day may quarantine, however few it has (up to half of them).
    """

    rate: float
    floor_rows: int = 0

    @classmethod
    def of(cls, limit: QuarantineLimit | float) -> QuarantineLimit:
        """A limit as given, or a bare share as a limit without a floor."""
        return limit if isinstance(limit, QuarantineLimit) else cls(limit)

    def floor(self, rows: int) -> int:
        """The floor as it applies to a day of ``rows`` rows: never more than half of them."""
        return min(self.floor_rows, rows // 2)

    def allowed(self, rows: int) -> float:
        """The most rows a day of ``rows`` rows may quarantine."""
        return max(self.rate * rows, self.floor(rows))

    def exceeded(self, count: int, rows: int) -> bool:
        """Whether quarantining ``count`` of ``rows`` rows fails the day."""
        # The share is compared as a rate, not as ``rate * rows`` rows, so no rounding of that
        # product moves the boundary.
        rate = count / rows if rows else 0.0
        return rate > self.rate and count > self.floor(rows)

    def describe(self, rows: int) -> str:
        """The limit for a day of ``rows`` rows: the share, or the floor where it is larger."""
        if self.floor(rows) <= self.rate * rows:
            return f"{self.rate:.2%}"
        return f"{self.floor(rows)} rows ({self.rate:.2%} of {rows} is fewer)"


class QuarantineRateExceeded(ValueError):
    """More of a partition would be quarantined than the configured limit allows."""

    def __init__(self, what: str, plan: QuarantinePlan, limit: QuarantineLimit):
        if limit.floor(plan.rows) <= limit.rate * plan.rows:
            within = f"above the {limit.rate:.2%} quarantine limit"
        else:
            within = (
                f"above the quarantine limit of {limit.floor(plan.rows)} rows for a day this "
                f"small (the {limit.rate:.2%} share allows fewer)"
            )
        super().__init__(
            f"{what}: {plan.rate:.2%} of rows ({plan.count} of {plan.rows}) cannot be scored, "
            f"{within}; nothing was published. Top reasons: {plan.describe()}"
        )
        self.rate, self.limit, self.reasons = plan.rate, limit.rate, plan.counts()
        self.allowed_rows = int(limit.allowed(plan.rows))


class RowConservationError(RuntimeError):
    """The model step returned a different number of results than the rows it was given."""


@dataclass(frozen=True)
class QuarantinePlan:
    """Which rows of one partition are quarantined, and why.

    Attributes:
        rows: rows in the partition.
        positions: sorted positions (0-based, in input order) of the quarantined rows.
        reasons: one reason per position.
        sources: the input files in read order with their rows, ``((file, rows), ...)``, when
            known: the positions run through them one after the other.
    """

    rows: int
    positions: np.ndarray
    reasons: np.ndarray
    sources: tuple[tuple[str, int], ...] = ()

    @classmethod
    def empty(cls, rows: int) -> QuarantinePlan:
        return cls(rows, np.zeros(0, np.int64), np.zeros(0, object))

    @property
    def count(self) -> int:
        return len(self.positions)

    @property
    def rate(self) -> float:
        return self.count / self.rows if self.rows else 0.0

    def counts(self) -> dict[str, int]:
        """Quarantined rows per reason, most common first."""
        return dict(Counter(self.reasons.tolist()).most_common())

    def describe(self, top: int = 3) -> str:
        counts = list(self.counts().items())
        if not counts:
            return "none"
        return ", ".join(f"{reason} {n}" for reason, n in counts[:top])

    def digest(self) -> str:
        """A stable hash of the plan: part of the checkpoint fingerprint, so progress made under
        different screening rules is never mixed with this attempt's."""
        h = hashlib.sha256(np.ascontiguousarray(self.positions, np.int64).tobytes())
        h.update("\n".join(self.reasons.tolist()).encode())
        if self.sources:  # quarantined rows with source columns are not mixed with rows without
            h.update(json.dumps(self.sources).encode())
        return h.hexdigest()[:16]

    def located(self, sources: Sequence[tuple[str, int]]) -> QuarantinePlan:
        """This plan, told the files its rows come from, in the order they were read.

        Args:
            sources: ``(file, rows)`` per input file; their rows must add up to the plan's.

        Raises:
            ValueError: the files hold a different number of rows than the plan screened.
        """
        total = sum(rows for _, rows in sources)
        if total != self.rows:
            raise ValueError(
                f"the quarantine plan screened {self.rows} rows but its {len(sources)} source "
                f"files hold {total}"
            )
        return replace(self, sources=tuple((str(f), int(n)) for f, n in sources))

    def check_rate(self, limit: QuarantineLimit | float, what: str) -> None:
        """Raises QuarantineRateExceeded when more rows are quarantined than ``limit`` allows.

        Args:
            limit: the day's limit (see :class:`QuarantineLimit`); a bare share means no floor.
            what: the asset and date, for the message.
        """
        limit = QuarantineLimit.of(limit)
        if limit.exceeded(self.count, self.rows):
            raise QuarantineRateExceeded(what, self, limit)

    def split(self, batch: pa.RecordBatch, offset: int) -> tuple[pa.RecordBatch, pa.Table | None]:
        """Splits a batch starting at input position ``offset`` into (rows to score, quarantine).

        The quarantined rows keep every input column, plus their ``row_number`` in the partition
        and the ``reason``; None when the batch has none.
        """
        lo, hi = np.searchsorted(self.positions, [offset, offset + batch.num_rows])
        if lo == hi:
            return batch, None
        local = self.positions[lo:hi] - offset
        keep = np.ones(batch.num_rows, bool)
        keep[local] = False
        bad = pa.Table.from_batches([batch.take(pa.array(local))])
        held = self._held(bad, self.positions[lo:hi], self.reasons[lo:hi])
        return batch.filter(pa.array(keep)), held

    def split_at(self, rows: pa.Table, positions: np.ndarray) -> tuple[pa.Table, pa.Table | None]:
        """:meth:`split` for rows at any input ``positions`` (one per row, e.g. a shard of
        accounts gathered from the whole day), not only a contiguous run."""
        if not self.count:
            return rows, None
        found = np.minimum(np.searchsorted(self.positions, positions), len(self.positions) - 1)
        bad = self.positions[found] == positions
        if not bad.any():
            return rows, None
        where = np.flatnonzero(bad)
        held = self._held(rows.take(pa.array(where)), positions[where], self.reasons[found[where]])
        return rows.filter(pa.array(~bad)), held

    def _held(self, rows: pa.Table, positions: np.ndarray, reasons: np.ndarray) -> pa.Table:
        """Quarantined rows with their ``row_number`` and ``reason``, and where known their
        ``source_file`` and ``source_row_number``."""
        rows = rows.append_column(ROW_NUMBER, pa.array(positions, pa.int64()))
        rows = rows.append_column(REASON, pa.array(reasons.tolist(), pa.string()))
        if not self.sources:
            return rows
        files, file_row = locate_rows(self.sources, positions)
        rows = rows.append_column(SOURCE_FILE, files)
        return rows.append_column(SOURCE_ROW_NUMBER, pa.array(file_row, pa.int64()))


def locate_rows(
    sources: Sequence[tuple[str, int]], positions: np.ndarray
) -> tuple[pa.Array, np.ndarray]:
    """For positions in input order across ``sources`` (``(file, rows)`` read one after the
    other): each one's file, and its row (0-based) in that file."""
    counts = np.array([rows for _, rows in sources], np.int64)
    ends = np.cumsum(counts)
    index = np.searchsorted(ends, positions, side="right")
    names = pa.array([name for name, _ in sources], pa.string())
    return names.take(pa.array(index)), positions - (ends - counts)[index]


class Screener:
    """Builds a :class:`QuarantinePlan` while a partition streams past, batch by batch.

    Each batch is screened with named boolean masks, in priority order: a row flagged by several
    rules gets the first reason. Keys registered with :meth:`keys` are checked for duplicates at
    the end, among rows not already quarantined: the first clean occurrence is scored, any later
    one is quarantined, since scoring both would publish two answers for one id. Memory does
    not grow with the rows when the ids arrive in order (:class:`KeyRuns`); otherwise the id
    column is read again for an exact check.
    """

    def __init__(self, reread_keys: Callable[[], pa.ChunkedArray] | None = None) -> None:
        """
        Args:
            reread_keys: reads the partition's id column again, in input order, when the ids
                are not shown unique by their runs (see :class:`KeyRuns`). Without it the ids
                registered with :meth:`keys` are held in memory until :meth:`plan`.
        """
        self.rows = 0
        self._positions: list[np.ndarray] = []
        self._reasons: list[np.ndarray] = []
        self._runs = KeyRuns()
        self._held: list[pa.Array] = []
        self._reread = reread_keys
        self._key_reason = "duplicate_id"

    def add(self, rows: int, rules: dict[str, np.ndarray]) -> np.ndarray:
        """Screens the next ``rows`` rows; returns the mask of rows quarantined so far in them."""
        flagged = np.zeros(rows, bool)
        reasons = np.empty(rows, object)
        for reason, mask in rules.items():
            new = np.asarray(mask, bool) & ~flagged
            reasons[new] = reason
            flagged |= new
        local = np.flatnonzero(flagged)
        self._positions.append(local + self.rows)
        self._reasons.append(reasons[local])
        self.rows += rows
        return flagged

    def keys(self, values: pa.Array | pa.ChunkedArray, reason: str) -> None:
        """Registers the id column of the rows added so far (call once per batch, after add)."""
        self._key_reason = reason
        self._runs.add(values)
        if self._reread is None:
            self._held.append(values)

    def plan(self) -> QuarantinePlan:
        positions = np.concatenate(self._positions or [np.zeros(0, np.int64)]).astype(np.int64)
        reasons = np.concatenate(self._reasons or [np.zeros(0, object)])
        if self._runs.seen and not self._runs.unique():
            keys = self._reread() if self._reread else pa.chunked_array(self._held)
            dup = duplicates(keys, exclude=positions)
            positions = np.concatenate([positions, dup])
            reasons = np.concatenate([reasons, np.full(len(dup), self._key_reason, object)])
            order = np.argsort(positions, kind="stable")
            positions, reasons = positions[order], reasons[order]
        return QuarantinePlan(self.rows, positions, reasons)


class KeyRuns:
    """Shows that ids are unique without holding them, in the common case.

    Ids usually arrive in increasing runs: each landing file written in id order, files
    covering ranges that do not overlap (one writer per range, or ids that carry a time or a
    writer prefix). Only each run's first and last id are kept; if the runs are strictly
    increasing and their ranges disjoint, no id can repeat. Anything else (an id out of order,
    too many runs) gives up, and the caller checks the ids themselves.
    """

    MAX_RUNS = 10_000

    def __init__(self) -> None:
        self.runs: list[list] = []
        self.ordered = True
        self.seen = False  # whether any batch of ids was added

    def add(self, values: pa.Array | pa.ChunkedArray) -> None:
        self.seen = True
        if not self.ordered:
            return
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        values = values.drop_null()  # null ids are quarantined by their own rule
        if not len(values):
            return
        if len(values) > 1 and not pc.all(pc.less(values[:-1], values[1:])).as_py():
            self.ordered = False
            return
        first, last = values[0].as_py(), values[-1].as_py()
        if self.runs and first > self.runs[-1][1]:
            self.runs[-1][1] = last
        else:
            self.runs.append([first, last])
            self.ordered = len(self.runs) <= self.MAX_RUNS

    def unique(self) -> bool:
        if not self.ordered:
            return False
        runs = sorted(self.runs)
        return all(a[1] < b[0] for a, b in zip(runs, runs[1:], strict=False))


def duplicates(keys: pa.ChunkedArray, exclude: np.ndarray | None = None) -> np.ndarray:
    """Positions of repeated keys after their first occurrence, ignoring nulls and ``exclude``.

    Distinct values are counted with a hash table first; positions are only worked out when
    some key does repeat. (Keys in increasing runs never get here: :class:`KeyRuns` shows
    them unique without holding them.)
    """
    distinct = len(pc.unique(keys)) - (1 if keys.null_count else 0)
    if distinct == len(keys) - keys.null_count:
        return np.zeros(0, np.int64)
    codes = keys.combine_chunks().dictionary_encode().indices
    codes = pc.fill_null(codes, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    if exclude is not None and len(exclude):
        codes[exclude] = -1
    _, first = np.unique(codes, return_index=True)
    repeated = codes >= 0
    repeated[first] = False
    return np.flatnonzero(repeated).astype(np.int64)


# -- rules: boolean masks over one batch's column --------------------------------------------


def is_null(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if not values.null_count:
        return np.zeros(len(values), bool)
    return pc.is_null(values).to_numpy(zero_copy_only=False)


def not_finite(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """NaN or infinite (nulls are reported by :func:`is_null`)."""
    return pc.fill_null(pc.invert(pc.is_finite(values)), False).to_numpy(zero_copy_only=False)


def below(values: pa.Array | pa.ChunkedArray, floor: float) -> np.ndarray:
    return pc.fill_null(pc.less(values, floor), False).to_numpy(zero_copy_only=False)


def above(values: pa.Array | pa.ChunkedArray, ceiling: float) -> np.ndarray:
    """Finite values greater than ``ceiling`` (infinities are ``not_finite``'s to report)."""
    over = pc.and_(pc.greater(values, ceiling), pc.is_finite(values))
    return pc.fill_null(over, False).to_numpy(zero_copy_only=False)


def outside(values: pa.Array | pa.ChunkedArray, start: pa.Scalar, end: pa.Scalar) -> np.ndarray:
    """Values outside ``[start, end)``, e.g. timestamps outside the partition's day."""
    inside = pc.and_(pc.greater_equal(values, start), pc.less(values, end))
    return pc.fill_null(pc.invert(inside), False).to_numpy(zero_copy_only=False)


def invalid_utf8(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Strings whose bytes are not UTF-8 (Arrow does not check on read; Python would crash)."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    masks = []
    for chunk in chunks:
        try:
            chunk.validate(full=True)
            masks.append(np.zeros(len(chunk), bool))
        except pa.ArrowInvalid:
            raw = chunk.view(pa.binary()).to_pylist()
            masks.append(np.array([_not_utf8(b) for b in raw], bool))
    return np.concatenate(masks or [np.zeros(0, bool)])


def _not_utf8(raw: bytes | None) -> bool:
    if raw is None:
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


# Characters that show nothing and are not Unicode whitespace, so a whitespace trim keeps them:
# a text of only these (a CMS's leftover byte-order mark, an editor's zero-width space) reads
# as empty to a person and to a model.
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
_NO_ZERO_WIDTH = dict.fromkeys(map(ord, ZERO_WIDTH))


def is_blank_text(text: str | None) -> bool:
    """Whether a text is None, empty, or only whitespace and zero-width characters."""
    return not text or not text.translate(_NO_ZERO_WIDTH).strip()


def blank(values: pa.Array | pa.ChunkedArray, valid: np.ndarray | None = None) -> np.ndarray:
    """Null, empty, or only whitespace and zero-width characters (:data:`ZERO_WIDTH`);
    ``valid`` masks rows safe to inspect (UTF-8)."""
    if valid is not None and not valid.all():
        values = pc.if_else(pa.array(valid), values, pa.scalar("x", values.type))
    visible = pc.replace_substring_regex(values, f"[{ZERO_WIDTH}]", "")
    trimmed = pc.utf8_trim_whitespace(visible)
    return pc.fill_null(pc.equal(pc.utf8_length(trimmed), 0), True).to_numpy(zero_copy_only=False)


def longer_than(values: pa.Array | pa.ChunkedArray, limit: int) -> np.ndarray:
    """Strings of more than ``limit`` bytes."""
    return pc.fill_null(pc.greater(pc.binary_length(values), limit), False).to_numpy(
        zero_copy_only=False
    )
