"""The per-day profile that fraud features look each transaction up in, and the features.

A pre-pass over five columns streams through a :class:`ProfileBuilder` into a
:class:`PartitionProfile` (per-account counts and amounts, account-merchant and account-country
pairs, each account's sorted event times); the scoring pass then streams record batches and
looks each row's context up in it. Only the event keys (8 bytes a row) grow with the rows; the
rest grows with accounts, merchants and pairs, and no string column is ever held. Features use
the partition alone, with no state carried between days, so any day can be scored, re-scored or
backfilled on its own and training and scoring compute exactly the same thing.

The profile is made of streaming aggregates (string codes, per-code or per-key counts, events):
each grows batch by batch with the distinct values it has seen (accounts, merchants, pairs),
never with the rows, so a day's profile is built in one pass without holding a string column.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inference.engine.batching import Behind
from inference.tabular.tabular import stack_features


def as_strings(column: pa.ChunkedArray | pa.Array, name: str) -> pa.Array:
    """``column`` as one string array; raises ValueError if it holds nulls."""
    if column.null_count:
        raise ValueError(f"column '{name}' has {column.null_count} null values")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.cast(pa.string()) if column.type != pa.string() else column


def positions_in(known: pa.Array, column: pa.Array) -> pa.Array:
    """Each row's position in ``known`` (null where it is not there), hashed in Arrow.

    At the screening pass's batch sizes Arrow's hash lookup is several times faster than
    dictionary-encoding each batch and looking its distinct values up in a Python dict.
    """
    return pc.index_in(column, value_set=known)


class Vocabulary:
    """A string -> code mapping that grows batch by batch; codes follow first appearance."""

    def __init__(self, name: str):
        self.name = name
        self.known = pa.array([], pa.string())

    def encode(self, column: pa.ChunkedArray | pa.Array) -> np.ndarray:
        """Each row's code, new values taking the next free codes."""
        column = as_strings(column, self.name)
        codes = positions_in(self.known, column)
        if codes.null_count:
            new = pc.unique(column.filter(pc.is_null(codes)))
            extra = pc.add(positions_in(new, column), pa.scalar(len(self.known), codes.type))
            codes = pc.coalesce(codes, extra)
            self.known = pa.concat_arrays([self.known, new])
        return codes.to_numpy(zero_copy_only=False).astype(np.int64)

    def __len__(self) -> int:
        return len(self.known)


class Counts:
    """Per-code sums that grow with the vocabulary they are indexed by."""

    def __init__(self, dtype: type):
        self.values = np.zeros(0, dtype)

    def add(self, codes: np.ndarray, size: int, weights=None) -> None:
        if len(self.values) < size:
            grown = np.zeros(max(size, 2 * len(self.values)), self.values.dtype)
            grown[: len(self.values)] = self.values
            self.values = grown
        sums = np.bincount(codes, weights=weights, minlength=size)
        self.values[:size] += sums.astype(self.values.dtype)

    def result(self, size: int) -> np.ndarray:
        return self.values[:size].copy()


class KeyCounts:
    """Counts of int64 keys seen batch by batch, merged as they pile up: memory follows the
    distinct keys, not the rows.

    A merge folds the pending batches' keys into the sorted, distinct ``keys`` by binary search
    instead of re-sorting everything, so its temporaries scale with what was pending, not with
    every key seen: a sort of everything would be the pass's memory peak on a large day.
    """

    PENDING = 1 << 18

    def __init__(self) -> None:
        self.keys, self.counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0

    def add(self, keys: np.ndarray, sign: int = 1) -> None:
        distinct, counts = np.unique(keys, return_counts=True)
        self._pending.append((distinct, sign * counts))
        self._pending_size += len(distinct)
        if self._pending_size > self.PENDING:
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        keys = np.concatenate([k for k, _ in self._pending])
        counts = np.concatenate([c for _, c in self._pending])
        self._pending, self._pending_size = [], 0
        keys, inverse = np.unique(keys, return_inverse=True)
        counts = np.bincount(inverse, weights=counts, minlength=len(keys)).astype(np.int64)
        at = np.searchsorted(self.keys, keys)
        known = at < len(self.keys)
        known[known] = self.keys[at[known]] == keys[known]
        self.counts[at[known]] += counts[known]  # distinct keys: each position once
        if not known.all():
            fresh = ~known
            self.keys = np.insert(self.keys, at[fresh], keys[fresh])
            self.counts = np.insert(self.counts, at[fresh], counts[fresh])
        if (self.counts <= 0).any():
            kept = self.counts > 0
            self.keys, self.counts = self.keys[kept], self.counts[kept]

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        self._merge()
        return self.keys, self.counts


class Events:
    """Every row's event key, in a buffer that grows by doubling (or is sized up front)."""

    def __init__(self, capacity: int = 0):
        self.keys, self.size = np.empty(capacity, np.int64), 0

    def add(self, keys: np.ndarray) -> None:
        end = self.size + len(keys)
        if end > len(self.keys):
            grown = np.empty(max(end, 2 * len(self.keys)), np.int64)
            grown[: self.size] = self.keys[: self.size]
            self.keys = grown
        self.keys[self.size : end] = keys
        self.size = end

    def sorted(self, remove: np.ndarray) -> np.ndarray:
        keys = self.keys[: self.size]
        keys.sort()
        if len(remove):
            # One occurrence per removed row: the i-th copy of a key removes the i-th match.
            remove = np.sort(remove)
            copy = np.arange(len(remove)) - np.searchsorted(remove, remove)
            keys = np.delete(keys, np.searchsorted(keys, remove) + copy)
        return keys


PROFILE_COLUMNS = ["account_id", "merchant_id", "country", "amount", "ts"]
CHANNELS = ("pos", "online", "atm", "contactless")
_CHANNEL_VALUES = pa.array(CHANNELS, pa.string())
# Seconds either side of a transaction in which the account's other transactions count as a burst.
BURST_WINDOWS = {"burst_10m": 600, "burst_1h": 3600}
_WIDEST = max(BURST_WINDOWS.values())


# Event keys pack (account code, second) into one int64 that sorts by account, then time: the
# code in the high 32 bits, the second as an offset from the profile's first second, shifted to
# be unsigned, in the low 32. A window of +-w seconds around a key stays inside its account's
# range as long as every offset stays at least _WIDEST away from either end (about 68 years).
_SECOND_BIAS = 1 << 31
_SECOND_MASK = (1 << 32) - 1
# A batch with fewer rows than 1/DICT_LOOKUP_RATIO of a vocabulary looks its codes up in a
# Python dict built once, instead of Arrow hashing the whole vocabulary for it: Arrow's cost
# per batch follows the vocabulary, not the batch, so small batches (down to a row at a time)
# would pay it over and over.
DICT_LOOKUP_RATIO = 8


def _seconds(ts: pa.ChunkedArray | pa.Array) -> np.ndarray:
    micros = pc.cast(ts, pa.int64()).to_numpy(zero_copy_only=False)
    return micros // 1_000_000


def _log_amount(amount: pa.ChunkedArray | pa.Array) -> np.ndarray:
    values = np.asarray(amount.to_numpy(zero_copy_only=False), dtype=np.float64)
    return np.log1p(np.clip(values, 0.0, None))


def _event_keys(acc: np.ndarray, seconds: np.ndarray, base: int) -> np.ndarray:
    offset = seconds - base + _SECOND_BIAS
    if len(offset) and (offset.min() < _WIDEST or offset.max() > _SECOND_MASK - _WIDEST):
        raise ValueError("transaction times span more than 68 years: cannot build burst features")
    return (acc.astype(np.int64) << 32) | offset


class ProfileBuilder:
    """Builds a :class:`PartitionProfile` from a stream of record batches in one pass.

    Memory follows the partition's accounts, merchants and (account, merchant/country) pairs,
    plus one 8-byte event key per row for the burst windows, never the rows' strings. Rows can
    be taken out again (:meth:`remove`) before :meth:`finish`, e.g. duplicates found after the
    pass.
    """

    def __init__(self, rows_hint: int = 0, overlap: bool = False):
        """``overlap`` aggregates each batch on a background thread while the caller encodes
        the next (Arrow and numpy's sorts release the GIL); :meth:`finish` waits for it."""
        self._behind = Behind("nightshift-profile") if overlap else None
        self.accounts = Vocabulary("account_id")
        self.merchants = Vocabulary("merchant_id")
        self.countries = Vocabulary("country")
        self.account_txns = Counts(np.int64)
        self.account_log_amount_sum = Counts(np.float64)
        self.country_counts = Counts(np.int64)
        self.merchant_pairs, self.country_pairs = KeyCounts(), KeyCounts()
        self.events = Events(rows_hint)
        self.rows = 0
        self.base: int | None = None
        self._removed: list[np.ndarray] = []

    def add(self, batch: pa.RecordBatch, sign: int = 1) -> None:
        """Adds a batch holding at least :data:`PROFILE_COLUMNS` (``sign=-1`` takes it out)."""
        if not batch.num_rows:
            return
        for name in ("amount", "ts"):
            if batch[name].null_count:
                raise ValueError(f"column '{name}' has {batch[name].null_count} null values")
        acc = self.accounts.encode(batch["account_id"])
        merch = self.merchants.encode(batch["merchant_id"])
        country = self.countries.encode(batch["country"])
        log_amount = _log_amount(batch["amount"])
        seconds = _seconds(batch["ts"])
        if self.base is None:
            self.base = int(seconds.min())
        keys = _event_keys(acc, seconds, self.base)
        self.rows += sign * batch.num_rows
        sizes = len(self.accounts), len(self.countries)
        if self._behind is None:
            self._aggregate(acc, merch, country, log_amount, keys, sizes, sign)
        else:
            self._behind.submit(self._aggregate, acc, merch, country, log_amount, keys, sizes, sign)

    def _aggregate(self, acc, merch, country, log_amount, keys, sizes, sign) -> None:
        n_acc, n_country = sizes
        weight = None if sign == 1 else np.full(len(acc), sign)
        self.account_txns.add(acc, n_acc, weight)
        self.account_log_amount_sum.add(acc, n_acc, sign * log_amount)
        self.country_counts.add(country, n_country, weight)
        self.merchant_pairs.add((acc << 32) | merch, sign)
        self.country_pairs.add((acc << 32) | country, sign)
        if sign == 1:
            self.events.add(keys)
        else:
            self._removed.append(keys)

    def remove(self, batch: pa.RecordBatch) -> None:
        """Takes rows added earlier out of the profile again."""
        self.add(batch, sign=-1)

    def close(self) -> None:
        """Waits for the batch being aggregated and stops the background thread, if any."""
        if self._behind is not None:
            try:
                self._behind.wait()
            finally:
                self._behind.close()
                self._behind = None

    def finish(self) -> PartitionProfile:
        self.close()
        if self.rows <= 0:
            raise ValueError("the partition has no transactions")
        n_acc, n_merch = len(self.accounts), len(self.merchants)
        merchant_keys, merchant_counts = self.merchant_pairs.result()
        country_keys, country_counts = self.country_pairs.result()
        removed = np.concatenate(self._removed) if self._removed else np.zeros(0, np.int64)
        return PartitionProfile(
            accounts=self.accounts.known,
            merchants=self.merchants.known,
            countries=self.countries.known,
            account_txns=self.account_txns.result(n_acc),
            account_log_amount_sum=self.account_log_amount_sum.result(n_acc),
            merchant_pair_keys=merchant_keys,
            merchant_pair_counts=merchant_counts,
            merchant_reach=np.bincount(merchant_keys & _SECOND_MASK, minlength=n_merch),
            country_pair_keys=country_keys,
            country_pair_counts=country_counts,
            country_counts=self.country_counts.result(len(self.countries)),
            rows=self.rows,
            event_keys=self.events.sorted(removed),
            base=self.base,
        )


def _search(
    haystack: np.ndarray, needles: np.ndarray, order: np.ndarray, side="left"
) -> np.ndarray:
    """``np.searchsorted`` with the needles visited in sorted order (``order`` sorts them).

    numpy starts each search from the previous result when needles increase, and the probes
    stay in cache: faster than unsorted needles on a large profile, argsort included.
    """
    found = np.empty(len(needles), np.int64)
    found[order] = np.searchsorted(haystack, needles[order], side=side)
    return found


@dataclass(frozen=True)
class PartitionProfile:
    """Per-partition aggregates that the row-level features look rows up in.

    Pairs are keyed ``account_code << 32 | merchant_or_country_code``; events ``account_code
    << 32 | biased second`` (see :func:`_event_keys`), sorted.
    """

    accounts: pa.Array  # each code's value, in code order
    merchants: pa.Array
    countries: pa.Array
    account_txns: np.ndarray
    account_log_amount_sum: np.ndarray
    merchant_pair_keys: np.ndarray
    merchant_pair_counts: np.ndarray
    merchant_reach: np.ndarray
    country_pair_keys: np.ndarray
    country_pair_counts: np.ndarray
    country_counts: np.ndarray
    rows: int
    event_keys: np.ndarray
    base: int
    # Python dicts over the vocabularies, built on first use by a small batch.
    _small_batch_codes: dict[str, dict] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, batches: Iterable[pa.RecordBatch], rows_hint: int = 0) -> PartitionProfile:
        """Aggregates a partition from a stream holding at least :data:`PROFILE_COLUMNS`."""
        builder = ProfileBuilder(rows_hint)
        for batch in batches:
            builder.add(batch)
        return builder.finish()

    def _codes(self, known: pa.Array, column: pa.Array, name: str) -> np.ndarray:
        column = as_strings(column, name)
        if len(column) * DICT_LOOKUP_RATIO < len(known):
            # index_in hashes the whole vocabulary on every call, which a batch much smaller
            # than the vocabulary does not pay back; those look codes up in a dict built once.
            if name not in self._small_batch_codes:
                values = known.to_pylist()
                self._small_batch_codes[name] = dict(zip(values, range(len(values)), strict=True))
            lookup = self._small_batch_codes[name].get
            codes = np.array(list(map(lookup, column.to_pylist(), repeat(-1))), np.int64)
            missing = int((codes < 0).sum())
        else:
            found = positions_in(known, column)
            missing = found.null_count
            codes = found.to_numpy(zero_copy_only=False) if not missing else None
        if missing:
            raise ValueError(
                f"{missing} '{name}' values are not in the partition profile: "
                "the landing data changed between the pre-pass and scoring"
            )
        return codes.astype(np.int64)

    def _pair_lookup(self, keys: np.ndarray, counts: np.ndarray, query: np.ndarray) -> np.ndarray:
        return counts[_search(keys, query, np.argsort(query))]

    def columns(self, batch: pa.RecordBatch) -> dict[str, np.ndarray]:
        """Every feature in :data:`inference.fraud.features.FEATURES` for the rows of one batch."""
        acc = self._codes(self.accounts, batch["account_id"], "account_id")
        merch = self._codes(self.merchants, batch["merchant_id"], "merchant_id")
        country = self._codes(self.countries, batch["country"], "country")
        log_amount = _log_amount(batch["amount"])
        seconds = _seconds(batch["ts"])

        txns = self.account_txns[acc]
        others = np.maximum(txns - 1, 1)
        others_mean = (self.account_log_amount_sum[acc] - log_amount) / others
        usual = np.where(txns > 1, others_mean, log_amount)
        hour = (seconds % 86_400) / 3_600.0
        merchant_visits = self._pair_lookup(
            self.merchant_pair_keys, self.merchant_pair_counts, (acc << 32) | merch
        )
        country_txns = self._pair_lookup(
            self.country_pair_keys, self.country_pair_counts, (acc << 32) | country
        )
        out = {
            "log_amount": log_amount,
            "amount_vs_account": log_amount - usual,
            "hour_sin": np.sin(2 * np.pi * hour / 24),
            "hour_cos": np.cos(2 * np.pi * hour / 24),
            "country_share_account": country_txns / txns,
            "country_log_frequency": np.log(self.country_counts[country] / self.rows),
            "merchant_new_to_account": (merchant_visits == 1).astype(np.float32),
            "merchant_log_reach": np.log1p(self.merchant_reach[merch]),
            "account_log_txns": np.log1p(txns),
        }
        # One hashing pass against the four channels (half the cost of four string compares);
        # a missing or unknown channel matches none of them.
        channel = pc.index_in(batch["channel"], value_set=_CHANNEL_VALUES)
        channel = pc.fill_null(channel, -1).to_numpy(zero_copy_only=False)
        for code, name in enumerate(CHANNELS):
            out[f"channel_{name}"] = channel == code
        key = _event_keys(acc, seconds, self.base)
        order = np.argsort(key)
        for name, window in BURST_WINDOWS.items():
            inside = _search(self.event_keys, key + window, order, "right") - _search(
                self.event_keys, key - window, order
            )
            out[name] = np.log1p(inside - 1)
        return out

    def features(self, batch: pa.RecordBatch, names: Sequence[str]) -> np.ndarray:
        """The named features of one batch as a float32 matrix, columns in ``names`` order."""
        return stack_features(self.columns(batch), names)
