"""Training the tabular MLP: a stratified validation split, early stopping on validation AUPRC,
and the flagging threshold with the best F1 there."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from inference.tabular.tabular_metrics import average_precision, best_f1_threshold, roc_auc
from inference.tabular.tabular_model import MODEL_KIND, Standardizer, build_mlp

if TYPE_CHECKING:
    import torch
    from torch import nn

MIN_STEPS_PER_EPOCH = 50


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
    # busy CPU extra threads spin-wait on each other, and an epoch can take many times longer
    # than on one thread. Training on the CPU therefore uses this many.
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
    import torch

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
    import torch
    from torch import nn

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
    import torch

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
    import torch

    model.eval()
    out = []
    with torch.inference_mode():
        for start in range(0, len(x), chunk):
            batch = torch.from_numpy(x[start : start + chunk]).to(device)
            out.append(torch.sigmoid(model(batch).squeeze(1)).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0, np.float32)
