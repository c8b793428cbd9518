"""Streaming aggregates for the fraud profile: string codes and per-code or per-key counts.

Each grows batch by batch with the distinct values it has seen (accounts, merchants, pairs),
never with the rows, so a day's profile can be built in one pass without holding a string column.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


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
