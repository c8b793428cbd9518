"""The tabular MLP and what it reads: named numeric columns stacked into a matrix, standardised."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from torch import nn

MODEL_KIND = "tabular_mlp"


def stack_features(columns: Mapping[str, Any], features: Sequence[str]) -> np.ndarray:
    """Stacks the named numeric columns of a table-like object into a float32 matrix.

    Args:
        columns: anything indexable by column name (dict of arrays, DataFrame, Arrow table).
        features: the column names, in model order.

    Raises:
        KeyError: a feature column is missing.
        ValueError: a feature column is not numeric or holds NaN/inf.
    """
    out = []
    for name in features:
        try:
            values = columns[name]
        except KeyError:
            raise KeyError(f"feature column '{name}' is missing") from None
        array = np.asarray(values)
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
            raise ValueError(f"feature column '{name}' is not numeric (dtype {array.dtype})")
        array = array.astype(np.float32, copy=False)
        if not np.isfinite(array).all():
            raise ValueError(f"feature column '{name}' holds NaN or infinite values")
        out.append(array)
    return np.stack(out, axis=1) if out else np.zeros((0, 0), np.float32)


@dataclass(frozen=True)
class Standardizer:
    """Per-feature mean and standard deviation; constant features are left unscaled."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> Standardizer:
        x = x.astype(np.float64)
        std = x.std(axis=0)
        return cls(mean=x.mean(axis=0), std=np.where(std > 1e-12, std, 1.0))

    def transform(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.mean) / self.std).astype(np.float32)


def build_mlp(in_features: int, hidden: Sequence[int], dropout: float = 0.0) -> nn.Sequential:
    """A ReLU MLP that returns one logit per row."""
    from torch import nn

    layers: list[nn.Module] = []
    width = in_features
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = size
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)
