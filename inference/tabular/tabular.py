"""Binary classifiers over named numeric columns: scoring with a saved MLP.

Nothing here knows about a domain: callers name the feature columns, and the saved manifest
carries those names with their normalisation, so scoring applies exactly what training saw.
The model and its inputs are in ``inference.tabular.tabular_model``, training in
``inference.tabular.tabular_training``, the metrics in ``inference.tabular.tabular_metrics``; their public names
are importable from here too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from inference.engine.adaptive import AdaptiveBatchSize, BatchSizes
from inference.engine.device import Runtime, to_device
from inference.tabular.ranges import FeatureRanges
from inference.tabular.tabular_metrics import (
    average_precision,
    best_f1_threshold,
    roc_auc,
)
from inference.tabular.tabular_model import MODEL_KIND, Standardizer, build_mlp, stack_features
from inference.tabular.tabular_training import (
    TrainConfig,
    TrainedClassifier,
    stratified_split,
    train_classifier,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "MODEL_KIND",
    "Standardizer",
    "TabularScorer",
    "TrainConfig",
    "TrainedClassifier",
    "average_precision",
    "best_f1_threshold",
    "build_mlp",
    "roc_auc",
    "stack_features",
    "stratified_split",
    "train_classifier",
]


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
        # The training ranges, when the model was saved with them (see inference.tabular.ranges).
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
        import torch

        if x.ndim != 2 or x.shape[1] != len(self.features):
            raise ValueError(f"expected {len(self.features)} feature columns, got shape {x.shape}")
        device, dtype = self.runtime.device, self.runtime.dtype

        sizing = self.batch_sizing(max_rows) if max_rows else None

        def call(start: int, stop: int) -> torch.Tensor:
            rows = self.standardizer.transform(x[start:stop])
            n = stop - start
            if sizing is not None and n < sizing.size:
                # The last call is padded (copies of its last row) to the shape of the others.
                # CPU matmul kernels are chosen by the row count, and a row's score could
                # differ in its last bit with the number of rows it is called with; at one
                # shape it does not depend on which rows share its call, so a day scored whole
                # and scored in shards of accounts agree bit for bit (unpadded, a few rows of a
                # shuffled day differ).
                rows = np.concatenate([rows, np.repeat(rows[-1:], sizing.size - n, axis=0)])
            logits = self.model(to_device(torch.from_numpy(rows), device).to(dtype))
            return torch.sigmoid(logits.squeeze(1).float())[:n]

        with torch.inference_mode():
            # Every model call is queued before the one read-back: on a GPU the host
            # standardises and copies the next rows while the current ones run. Calls of
            # max_rows back off on out-of-memory (see batch_sizing).
            if sizing is not None:
                out = [part for _, _, part in sizing.run(len(x), call)]
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
