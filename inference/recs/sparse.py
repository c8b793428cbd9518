"""Sparse user x item data: a vocabulary from external ids to dense rows, and a row-compressed
matrix of who interacted with what (seen items, targets, training weights)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Vocabulary:
    """Maps sparse external ids (user_id, item_id) to dense row indices and back."""

    ids: np.ndarray  # sorted, unique int64

    @classmethod
    def build(cls, ids: np.ndarray) -> Vocabulary:
        return cls(np.unique(np.asarray(ids, dtype=np.int64)))

    def __len__(self) -> int:
        return len(self.ids)

    def index(self, ids: np.ndarray) -> np.ndarray:
        """Dense indices of ``ids``; -1 where an id is not in the vocabulary."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(self.ids) == 0:
            return np.full(len(ids), -1, dtype=np.int64)
        pos = np.searchsorted(self.ids, ids).clip(max=len(self.ids) - 1)
        return np.where(self.ids[pos] == ids, pos, -1).astype(np.int64)


@dataclass(frozen=True)
class SparseRows:
    """A row-compressed (CSR) user x item matrix: seen items, targets or training weights.

    Row ``r`` holds columns ``indices[indptr[r]:indptr[r + 1]]``, sorted and unique.
    """

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray

    @classmethod
    def from_pairs(
        cls, rows: np.ndarray, cols: np.ndarray, n_rows: int, values: np.ndarray | None = None
    ) -> SparseRows:
        """Builds the matrix from (row, col[, value]) triples, summing duplicates.

        Pairs with a negative row or column (ids unknown to a vocabulary) are dropped.
        """
        rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
        vals = np.ones(len(rows)) if values is None else np.asarray(values, np.float64)
        keep = (rows >= 0) & (cols >= 0)
        rows, cols, vals = rows[keep], cols[keep], vals[keep]
        width = int(cols.max()) + 1 if len(cols) else 1
        keys, inverse = np.unique(rows * width + cols, return_inverse=True)
        summed = np.bincount(inverse, weights=vals, minlength=len(keys))
        indptr = np.zeros(n_rows + 1, dtype=np.int64)
        np.cumsum(np.bincount(keys // width, minlength=n_rows), out=indptr[1:])
        return cls(indptr, keys % width, summed.astype(np.float32))

    @property
    def n_rows(self) -> int:
        return len(self.indptr) - 1

    def row_lengths(self) -> np.ndarray:
        return np.diff(self.indptr)

    def take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Entries of the given rows as (position in ``rows``, column, value) arrays."""
        rows = np.asarray(rows, dtype=np.int64)
        starts, lengths = self.indptr[rows], self.indptr[rows + 1] - self.indptr[rows]
        local = np.repeat(np.arange(len(rows)), lengths)
        offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        pos = np.repeat(starts, lengths) + offsets
        return local, self.indices[pos], self.values[pos]

    def select(self, rows: np.ndarray) -> SparseRows:
        """The given rows, in that order, as a new matrix."""
        _, cols, vals = self.take(rows)
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(self.row_lengths()[rows], out=indptr[1:])
        return SparseRows(indptr, cols, vals)

    def minus(self, other: SparseRows) -> SparseRows:
        """Entries whose column is not in the same row of ``other`` (values dropped)."""
        local, cols, _ = self.take(np.arange(self.n_rows))
        o_local, o_cols, _ = other.take(np.arange(other.n_rows))
        width = int(max(cols.max(initial=0), o_cols.max(initial=0))) + 1
        fresh = ~np.isin(local * width + cols, o_local * width + o_cols)
        return SparseRows.from_pairs(local[fresh], cols[fresh], self.n_rows)
