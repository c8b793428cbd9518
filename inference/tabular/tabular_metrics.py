"""Binary-classification metrics in numpy: precision/recall by threshold, AUPRC, ROC-AUC and the
best-F1 threshold, on labels and scores of any length."""

from __future__ import annotations

import numpy as np


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
