"""Binary classifiers over named numeric columns: an MLP in plain torch, its training, metrics
computed in numpy, and batched streaming scoring.

Nothing here knows about a domain: callers name the feature columns, and the saved manifest
carries those names with their normalisation, so scoring applies exactly what training saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from inference.adaptive import AdaptiveBatchSize, BatchSizes
from inference.batching import prefetch
from inference.device import Runtime, to_device
from inference.metrics import BatchMetrics
from inference.ranges import FeatureRanges

MODEL_KIND = "tabular_mlp"
T = TypeVar("T")
MIN_STEPS_PER_EPOCH = 50


# -- metrics -------------------------------------------------------------------------------------
def _ranked(y_true: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    y_true = np.asarray(y_true).astype(np.int64).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if y_true.shape != scores.shape:
        raise ValueError(f"{y_true.shape[0]} labels but {scores.shape[0]} scores")
    order = np.argsort(-scores, kind="stable")
    return y_true[order], scores[order], order


def precision_recall_curve(
    y_true: np.ndarray, scores: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision and recall at each distinct score, highest threshold first.

    Returns:
        (precision, recall, thresholds), where row i flags every item scoring >= thresholds[i].
    """
    y, s, _ = _ranked(y_true, scores)
    positives = int(y.sum())
    if positives == 0:
        raise ValueError("precision/recall need at least one positive label")
    # Tied scores are one threshold: only the last index of each run of equal scores counts.
    last_of_tie = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]
    tps = np.cumsum(y)[last_of_tie]
    flagged = last_of_tie + 1
    return tps / flagged, tps / positives, s[last_of_tie]


def average_precision(y_true: np.ndarray, scores: np.ndarray) -> float:
    """Area under the precision-recall curve as a step sum (AUPRC, same as scikit-learn's AP)."""
    precision, recall, _ = precision_recall_curve(y_true, scores)
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def roc_auc(y_true: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve: the chance a random positive outranks a random negative.

    Computed from average ranks (Mann-Whitney U), so ties count one half.
    """
    y, s, _ = _ranked(y_true, scores)
    positives = int(y.sum())
    negatives = len(y) - positives
    if positives == 0 or negatives == 0:
        raise ValueError("ROC-AUC needs both positive and negative labels")
    ascending = s[::-1]
    _, start, counts = np.unique(ascending, return_index=True, return_counts=True)
    ranks = np.repeat(start + (counts + 1) / 2.0, counts)
    rank_sum = ranks[y[::-1] == 1].sum()
    return float((rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives))


def best_f1_threshold(y_true: np.ndarray, scores: np.ndarray) -> tuple[float, float, float]:
    """The score threshold with the best F1 on these labels.

    Returns:
        (threshold, precision, recall) at that threshold.
    """
    precision, recall, thresholds = precision_recall_curve(y_true, scores)
    f1 = np.divide(
        2 * precision * recall,
        precision + recall,
        out=np.zeros_like(precision),
        where=(precision + recall) > 0,
    )
    best = int(np.argmax(f1))
    return float(thresholds[best]), float(precision[best]), float(recall[best])


# -- data preparation ----------------------------------------------------------------------------
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


def stratified_split(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Splits row indices so each class keeps its share on both sides.

    Returns:
        (kept, held_out) index arrays; held_out holds about ``fraction`` of every class.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"split fraction must be in (0, 1), got {fraction}")
    rng = np.random.default_rng(seed)
    y = np.asarray(y).ravel()
    kept, held = [], []
    for label in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == label))
        n_held = int(round(len(rows) * fraction))
        if len(rows) >= 2:
            n_held = min(max(n_held, 1), len(rows) - 1)
        held.append(rows[:n_held])
        kept.append(rows[n_held:])
    return np.sort(np.concatenate(kept)), np.sort(np.concatenate(held))


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


# -- model ---------------------------------------------------------------------------------------
def build_mlp(in_features: int, hidden: Sequence[int], dropout: float = 0.0) -> nn.Sequential:
    """A ReLU MLP that returns one logit per row."""
    layers: list[nn.Module] = []
    width = in_features
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = size
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


@dataclass(frozen=True)
class TrainConfig:
    """How to train: architecture, optimiser, early stopping and the validation split."""

    hidden: tuple[int, ...] = (64, 32)
    dropout: float = 0.1
    epochs: int = 40
    batch_size: int = 512
    learning_rate: float = 2e-3
    weight_decay: float = 1e-4
    patience: int = 5
    validation_fraction: float = 0.2
    seed: int = 0
    # Mini-batches of a small MLP are far below the size where intra-op threads pay off; on a
    # busy CPU extra threads spin-wait on each other (one epoch measured 0.3 s on 1 thread,
    # 16 s on 2 with the other core loaded). Training on the CPU therefore uses this many.
    cpu_threads: int = 1


@dataclass
class TrainedClassifier:
    """A trained MLP with everything scoring needs, and how well it did on validation."""

    model: nn.Sequential
    standardizer: Standardizer
    features: list[str]
    threshold: float
    metrics: dict[str, float | int]
    config: TrainConfig
    seconds: float = 0.0
    history: list[float] = field(default_factory=list)

    def manifest(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """JSON metadata saved beside the weights. Timings stay out so the version hash,
        which covers the manifest, is the same for the same model."""
        return {
            "kind": MODEL_KIND,
            "features": list(self.features),
            "mean": [float(v) for v in self.standardizer.mean],
            "std": [float(v) for v in self.standardizer.std],
            "hidden": list(self.config.hidden),
            "dropout": self.config.dropout,
            "threshold": self.threshold,
            "metrics": dict(self.metrics),
            "train_config": {**asdict(self.config), "hidden": list(self.config.hidden)},
            **(extra or {}),
        }

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}


def train_classifier(
    x: np.ndarray,
    y: np.ndarray,
    features: Sequence[str],
    config: TrainConfig = TrainConfig(),
    device: torch.device | str = "cpu",
    log: Callable[[str], None] | None = None,
) -> TrainedClassifier:
    """Trains an MLP on a stratified split and keeps the epoch with the best validation AUPRC.

    The threshold is the one with the best F1 on the validation rows; the reported metrics are
    measured there too (with early stopping, slightly optimistic: hold out more data to audit).

    Args:
        x: float matrix, one column per name in ``features``.
        y: 0/1 labels.
        features: the column names, saved so scoring stacks the same columns in the same order.
        config: training settings.
        device: where to train.
        log: receives one line per epoch.
    """
    started = time.perf_counter()
    x, y = _checked_inputs(x, y, features)
    train_rows, val_rows = stratified_split(y, config.validation_fraction, config.seed)
    for side, rows in (("training", train_rows), ("validation", val_rows)):
        if len(np.unique(y[rows])) < 2:
            raise ValueError(
                f"the {side} split has only one class ({len(rows)} rows, {int(y[rows].sum())} "
                "positive): more labelled history is needed"
            )
    # Small training sets get smaller batches, so an epoch is still enough optimiser steps
    # for early stopping to judge progress by.
    batch_size = max(32, min(config.batch_size, len(train_rows) // MIN_STEPS_PER_EPOCH))
    standardizer = Standardizer.fit(x[train_rows])
    device = torch.device(device)
    x_train = torch.from_numpy(standardizer.transform(x[train_rows])).to(device)
    y_train = torch.from_numpy(y[train_rows].astype(np.float32)).to(device)
    x_val = standardizer.transform(x[val_rows])
    y_val = y[val_rows]

    model, history = _fit(x_train, y_train, x_val, y_val, config, batch_size, device, log)
    model = model.cpu().eval()
    val_scores = _predict(model, x_val, torch.device("cpu"))
    best_epoch = int(np.argmax(history)) + 1
    threshold, precision, recall = best_f1_threshold(y_val, val_scores)
    metrics = {
        "val_auprc": round(average_precision(y_val, val_scores), 6),
        "val_roc_auc": round(roc_auc(y_val, val_scores), 6),
        "val_precision_at_threshold": round(precision, 6),
        "val_recall_at_threshold": round(recall, 6),
        "train_rows": int(len(train_rows)),
        "train_positives": int(y[train_rows].sum()),
        "val_rows": int(len(val_rows)),
        "val_positives": int(y_val.sum()),
        "best_epoch": best_epoch,
        "epochs_run": len(history),
        "batch_size": batch_size,
    }
    return TrainedClassifier(
        model=model,
        standardizer=standardizer,
        features=list(features),
        threshold=threshold,
        metrics=metrics,
        config=config,
        seconds=time.perf_counter() - started,
        history=history,
    )


def _checked_inputs(
    x: np.ndarray, y: np.ndarray, features: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y).astype(np.int64).ravel()
    if x.ndim != 2 or x.shape[1] != len(features):
        raise ValueError(
            f"feature matrix has shape {x.shape} but {len(features)} features are named"
        )
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{x.shape[0]} feature rows but {y.shape[0]} labels")
    if not np.isin(y, (0, 1)).all():
        raise ValueError("labels must be 0 or 1")
    return x, y


def _fit(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_val: np.ndarray,
    y_val: np.ndarray,
    config: TrainConfig,
    batch_size: int,
    device: torch.device,
    log: Callable[[str], None] | None,
) -> tuple[nn.Sequential, list[float]]:
    """Runs the epochs; returns the model at its best validation AUPRC and the AUPRC history."""
    # A private RNG scope: the same seed gives the same weights without touching global state.
    with (
        torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
        _cpu_threads(config.cpu_threads if device.type == "cpu" else None),
    ):
        torch.manual_seed(config.seed)
        model = build_mlp(x_train.shape[1], config.hidden, config.dropout).to(device)
        optimiser = torch.optim.AdamW(
            model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
        )
        loss_fn = nn.BCEWithLogitsLoss()
        shuffle = torch.Generator().manual_seed(config.seed)
        best_state, history = None, []
        for epoch in range(1, config.epochs + 1):
            model.train()
            order = torch.randperm(len(x_train), generator=shuffle).to(device)
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                optimiser.zero_grad(set_to_none=True)
                loss_fn(model(x_train[rows]).squeeze(1), y_train[rows]).backward()
                optimiser.step()
            history.append(average_precision(y_val, _predict(model, x_val, device)))
            if log:
                log(f"epoch {epoch}: validation AUPRC {history[-1]:.4f}")
            best_epoch = int(np.argmax(history)) + 1
            if best_epoch == epoch:
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            elif epoch - best_epoch >= config.patience:
                break
    model.load_state_dict(best_state)
    return model, history


@contextmanager
def _cpu_threads(threads: int | None) -> Iterator[None]:
    """Runs the block with ``threads`` torch intra-op threads, then restores the previous count."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _predict(
    model: nn.Module, x: np.ndarray, device: torch.device, chunk: int = 65_536
) -> np.ndarray:
    model.eval()
    out = []
    with torch.inference_mode():
        for start in range(0, len(x), chunk):
            batch = torch.from_numpy(x[start : start + chunk]).to(device)
            out.append(torch.sigmoid(model(batch).squeeze(1)).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0, np.float32)


# -- scoring -------------------------------------------------------------------------------------
class TabularScorer:
    """Scores feature matrices with a saved MLP on the runtime's device and precision.

    Args:
        model: the MLP (any device; it is moved to the runtime's).
        standardizer: the training normalisation.
        features: column names in model order.
        threshold: scores at or above it are flagged.
        runtime: device and dtype to run on.
        ranges: the features' training ranges, for clamping and drift (None for a model saved
            without them).
    """

    def __init__(
        self,
        model: nn.Module,
        standardizer: Standardizer,
        features: Sequence[str],
        threshold: float,
        runtime: Runtime,
        ranges: FeatureRanges | None = None,
    ):
        self.runtime = runtime
        # The training ranges, when the model was saved with them (see inference.ranges).
        self.ranges = ranges
        self.model = model.to(device=runtime.device, dtype=runtime.dtype).eval()
        self.standardizer = standardizer
        self.features = list(features)
        self.threshold = float(threshold)
        self._sizes = BatchSizes()

    @classmethod
    def from_stored(
        cls, tensors: Mapping[str, torch.Tensor], manifest: Mapping[str, Any], runtime: Runtime
    ) -> TabularScorer:
        """Rebuilds the scorer from safetensors weights and the JSON manifest."""
        if manifest.get("kind") != MODEL_KIND:
            kind = manifest.get("kind")
            raise ValueError(f"manifest describes a '{kind}' model, not {MODEL_KIND}")
        features = list(manifest["features"])
        model = build_mlp(len(features), manifest["hidden"], manifest.get("dropout", 0.0))
        model.load_state_dict(dict(tensors))
        standardizer = Standardizer(
            mean=np.asarray(manifest["mean"], np.float64),
            std=np.asarray(manifest["std"], np.float64),
        )
        ranges = manifest.get("feature_ranges")
        return cls(
            model,
            standardizer,
            features,
            manifest["threshold"],
            runtime,
            FeatureRanges.from_json(ranges) if ranges else None,
        )

    @classmethod
    def from_trained(cls, trained: TrainedClassifier, runtime: Runtime) -> TabularScorer:
        return cls(
            trained.model, trained.standardizer, trained.features, trained.threshold, runtime
        )

    def score(self, x: np.ndarray, max_rows: int | None = None) -> np.ndarray:
        """Probabilities (float32 in [0, 1]) for the rows of a matrix in ``features`` order.

        Args:
            x: the feature matrix.
            max_rows: rows per model call at most (all at once when None).
        """
        if x.ndim != 2 or x.shape[1] != len(self.features):
            raise ValueError(f"expected {len(self.features)} feature columns, got shape {x.shape}")
        device, dtype = self.runtime.device, self.runtime.dtype

        def call(start: int, stop: int) -> torch.Tensor:
            rows = self.standardizer.transform(x[start:stop])
            logits = self.model(to_device(torch.from_numpy(rows), device).to(dtype))
            return torch.sigmoid(logits.squeeze(1).float())

        with torch.inference_mode():
            # Every model call is queued before the one read-back: on a GPU the host
            # standardises and copies the next rows while the current ones run. Calls of
            # max_rows back off on out-of-memory (see batch_sizing).
            if max_rows:
                out = [part for _, _, part in self.batch_sizing(max_rows).run(len(x), call)]
            else:
                out = [call(0, len(x))]
            if not out:
                return np.zeros(0, np.float32)
            return (out[0] if len(out) == 1 else torch.cat(out)).cpu().numpy()

    def batch_sizing(self, max_rows: int) -> AdaptiveBatchSize:
        """The rows per model call, starting at (and never above) ``max_rows``: halved on an
        out-of-memory error and grown back after a run of successes, kept across calls so a
        partition's later batches start at the size that fitted."""
        return self._sizes.at(max_rows)

    def score_columns(self, columns: Mapping[str, Any]) -> np.ndarray:
        return self.score(stack_features(columns, self.features))

    def score_stream(
        self,
        batches: Iterable[T],
        featurize: Callable[[T], np.ndarray],
        metrics: BatchMetrics,
        rows: Callable[[T], int] = len,
    ) -> Iterator[tuple[T, np.ndarray]]:
        """Scores a stream of input batches, featurising the next ones while the model runs.

        Args:
            batches: input batches, already cut to the model batch size.
            featurize: turns one batch into its feature matrix (in ``features`` order).
            metrics: records rows, batches and model time.
            rows: the number of rows in a batch.

        Yields:
            each input batch with its scores.
        """
        featurized = ((batch, featurize(batch)) for batch in batches)
        for batch, x in prefetch(featurized, depth=2):
            started = time.perf_counter()
            scores = self.score(x)
            metrics.record_batch(rows(batch), len(scores), time.perf_counter() - started)
            yield batch, scores
