"""Numeric fraud features from raw transactions, one partition (day) at a time.

A cheap pre-pass over five columns builds a :class:`PartitionProfile` (per-account counts and
amounts, account-merchant and account-country pairs, each account's sorted timestamps); the
scoring pass then streams record batches and looks each row's context up in it. Features use
the partition alone, with no state carried between days, so any day can be scored, re-scored or
backfilled on its own and training and scoring compute exactly the same thing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from inference.tabular import stack_features

PROFILE_COLUMNS = ["account_id", "merchant_id", "country", "amount", "ts"]
FEATURE_COLUMNS = [*PROFILE_COLUMNS, "channel"]
CHANNELS = ("pos", "online", "atm", "contactless")
# Seconds either side of a transaction in which the account's other transactions count as a burst.
BURST_WINDOWS = {"burst_10m": 600, "burst_1h": 3600}
_WIDEST = max(BURST_WINDOWS.values())

FEATURES: tuple[str, ...] = (
    "log_amount",
    "amount_vs_account",
    "hour_sin",
    "hour_cos",
    *(f"channel_{c}" for c in CHANNELS),
    "country_share_account",
    "country_log_frequency",
    "merchant_new_to_account",
    "merchant_log_reach",
    "account_log_txns",
    *BURST_WINDOWS,
)


def check_feature_names(names: Sequence[str]) -> None:
    """Raises ValueError naming any feature this module cannot compute."""
    unknown = [n for n in names if n not in FEATURES]
    if unknown:
        raise ValueError(f"unknown fraud features {unknown}; available: {list(FEATURES)}")
    if not names:
        raise ValueError("at least one feature must be selected")


def _encode(column: pa.ChunkedArray | pa.Array, name: str) -> tuple[pd.Index, np.ndarray]:
    if column.null_count:
        raise ValueError(f"column '{name}' has {column.null_count} null values")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = column.dictionary_encode()
    values = pd.Index(encoded.dictionary.to_numpy(zero_copy_only=False))
    return values, encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _seconds(ts: pa.ChunkedArray | pa.Array) -> np.ndarray:
    micros = pc.cast(ts, pa.int64()).to_numpy(zero_copy_only=False)
    return micros // 1_000_000


def _log_amount(amount: pa.ChunkedArray | pa.Array) -> np.ndarray:
    values = np.asarray(amount.to_numpy(zero_copy_only=False), dtype=np.float64)
    return np.log1p(np.clip(values, 0.0, None))


def _pair_counts(left: np.ndarray, right: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    return np.unique(left * width + right, return_counts=True)


@dataclass(frozen=True)
class PartitionProfile:
    """Per-partition aggregates that the row-level features look rows up in."""

    accounts: pd.Index
    merchants: pd.Index
    countries: pd.Index
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
    t0: int
    span: int

    @classmethod
    def build(cls, batches: Iterable[pa.RecordBatch]) -> PartitionProfile:
        """Aggregates a partition from a stream holding at least :data:`PROFILE_COLUMNS`."""
        parts = [b.select(PROFILE_COLUMNS) for b in batches]
        if not parts or not sum(b.num_rows for b in parts):
            raise ValueError("the partition has no transactions")
        table = pa.Table.from_batches(parts)
        for name in ("amount", "ts"):
            if table[name].null_count:
                raise ValueError(f"column '{name}' has {table[name].null_count} null values")
        accounts, acc = _encode(table["account_id"], "account_id")
        merchants, merch = _encode(table["merchant_id"], "merchant_id")
        countries, country = _encode(table["country"], "country")
        log_amount = _log_amount(table["amount"])
        seconds = _seconds(table["ts"])
        n_acc, n_merch, n_country = len(accounts), len(merchants), len(countries)

        merchant_keys, merchant_counts = _pair_counts(acc, merch, n_merch)
        country_keys, country_counts = _pair_counts(acc, country, n_country)
        # One sortable key per (account, second): an account's events form one contiguous,
        # time-ordered run, so a window count is two binary searches.
        t0 = int(seconds.min()) - _WIDEST
        span = int(seconds.max()) - t0 + _WIDEST + 1
        if n_acc * span >= 2**62:
            raise ValueError(f"partition spans too long a time ({span} s) for {n_acc} accounts")
        return cls(
            accounts=accounts,
            merchants=merchants,
            countries=countries,
            account_txns=np.bincount(acc, minlength=n_acc),
            account_log_amount_sum=np.bincount(acc, weights=log_amount, minlength=n_acc),
            merchant_pair_keys=merchant_keys,
            merchant_pair_counts=merchant_counts,
            merchant_reach=np.bincount(merchant_keys % n_merch, minlength=n_merch),
            country_pair_keys=country_keys,
            country_pair_counts=country_counts,
            country_counts=np.bincount(country, minlength=n_country),
            rows=table.num_rows,
            event_keys=np.sort(acc * span + (seconds - t0)),
            t0=t0,
            span=span,
        )

    def _codes(self, index: pd.Index, column: pa.Array, name: str) -> np.ndarray:
        codes = index.get_indexer(column.to_numpy(zero_copy_only=False))
        if (codes < 0).any():
            raise ValueError(
                f"{int((codes < 0).sum())} '{name}' values are not in the partition profile: "
                "the landing data changed between the pre-pass and scoring"
            )
        return codes.astype(np.int64)

    def _pair_lookup(self, keys: np.ndarray, counts: np.ndarray, query: np.ndarray) -> np.ndarray:
        return counts[np.searchsorted(keys, query)]

    def columns(self, batch: pa.RecordBatch) -> dict[str, np.ndarray]:
        """Every feature in :data:`FEATURES` for the rows of one batch."""
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
            self.merchant_pair_keys, self.merchant_pair_counts, acc * len(self.merchants) + merch
        )
        country_txns = self._pair_lookup(
            self.country_pair_keys, self.country_pair_counts, acc * len(self.countries) + country
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
        channel = batch["channel"]
        for name in CHANNELS:
            out[f"channel_{name}"] = pc.fill_null(pc.equal(channel, name), False).to_numpy(
                zero_copy_only=False
            )
        key = acc * self.span + (seconds - self.t0)
        for name, window in BURST_WINDOWS.items():
            inside = np.searchsorted(self.event_keys, key + window, side="right") - np.searchsorted(
                self.event_keys, key - window, side="left"
            )
            out[name] = np.log1p(inside - 1)
        return out

    def features(self, batch: pa.RecordBatch, names: Sequence[str]) -> np.ndarray:
        """The named features of one batch as a float32 matrix, columns in ``names`` order."""
        return stack_features(self.columns(batch), names)
