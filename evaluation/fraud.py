"""Fraud quality on real card transactions: nightshift's model against logistic regression.

The data is the committed 1,722-row sample of the ULB "Credit Card Fraud Detection" set
(tests/fixtures/creditcard_sample.csv; Database Contents License v1.0; all 492 frauds and 1,230
genuine rows; V1..V28 are PCA components). Its columns are not the transactions contract, so
the model is trained the way the fraud_model asset trains one (``train_classifier``, the same
MLP, threshold and training-range guard) on Time, V1..V28 and Amount, over random stratified
70/30 splits with five seeds, beside scikit-learn's logistic regression on standardised
features, the textbook baseline.

A second table sweeps the amount of held-out genuine transactions from 1e4 to 1e308: a model
that extrapolates gives its lowest scores to its most absurd inputs. It reports, for the raw
model and for the model behind nightshift's guard (clamp to the training range, mark rows far
beyond it for review), the share of swept rows that end up scored below the median genuine
score without being marked.

    python -m evaluation.fraud
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from evaluation.tables import metric_table
from inference.engine.device import Runtime
from inference.tabular.ranges import FeatureRanges
from inference.tabular.tabular import (
    TabularScorer,
    TrainConfig,
    average_precision,
    roc_auc,
    stratified_split,
    train_classifier,
)

CREDITCARD = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "creditcard_sample.csv"
DATASET = "ULB credit card sample (1,722 rows, 28.6% fraud)"
SEEDS = (0, 1, 2, 3, 4)
SWEEP = [10.0**k for k in range(4, 309)]


def load_creditcard(path: Path = CREDITCARD) -> tuple[np.ndarray, np.ndarray, list[str]]:
    frame = pd.read_csv(path, index_col=0)
    features = [c for c in frame.columns if c != "Class"]
    return frame[features].to_numpy(np.float64), frame["Class"].to_numpy(np.int8), features


def _logistic_regression(x_train, y_train, x_test, seed: int) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed))
    model.fit(x_train, y_train)
    return model.predict_proba(x_test)[:, 1]


def evaluate(path: Path = CREDITCARD, seeds: Sequence[int] = SEEDS) -> list[dict]:
    """AUPRC and ROC-AUC per method (mean and spread over the seeds), and the amount sweep.

    Returns:
        rows of dataset, method, metric, value, n (held-out rows, or swept rows).
    """
    x, y, features = load_creditcard(path)
    cpu = Runtime(torch.device("cpu"), torch.float32)
    amount = features.index("Amount")
    scores: dict[str, dict[str, list[float]]] = {}
    swept: dict[str, list[float]] = {"nightshift model, raw": [], "nightshift (guarded)": []}
    held_rows = 0
    for seed in seeds:
        # stratified_split holds out `fraction` of each class: 30% for testing.
        train_idx, test_idx = stratified_split(y, 0.3, seed)
        x_train, y_train, x_test, y_test = x[train_idx], y[train_idx], x[test_idx], y[test_idx]
        held_rows = len(test_idx)
        trained = train_classifier(x_train, y_train, features, TrainConfig(seed=seed), cpu.device)
        scorer = TabularScorer.from_trained(trained, cpu)
        ranges = FeatureRanges.fit(x_train, features)
        methods = {
            "nightshift (MLP, guarded)": scorer.score(ranges.guard(x_test).x),
            "logistic regression": _logistic_regression(x_train, y_train, x_test, seed),
        }
        for name, predicted in methods.items():
            got = scores.setdefault(name, {"auprc": [], "roc_auc": []})
            got["auprc"].append(average_precision(y_test, predicted))
            got["roc_auc"].append(roc_auc(y_test, predicted))
        genuine = x_test[y_test == 0]
        typical = float(np.median(scorer.score(ranges.guard(genuine).x)))
        rows = np.repeat(genuine[:1], len(SWEEP), axis=0)
        rows[:, amount] = SWEEP
        guarded = ranges.guard(rows)
        with warnings.catch_warnings():  # 1e308 overflows float32 on its way in: that is the point
            warnings.simplefilter("ignore", RuntimeWarning)
            raw = scorer.score(rows)
        safe = scorer.score(guarded.x)
        # Not ">= typical" counts a NaN score (an overflowed input) as silently wrong too.
        swept["nightshift model, raw"].append(float(np.mean(~(raw >= typical))))
        swept["nightshift (guarded)"].append(float(np.mean(~(safe >= typical) & ~guarded.review)))
    out = []
    for name, metrics in scores.items():
        for metric, values in metrics.items():
            out.append(_row(DATASET, name, f"{metric}", float(np.mean(values)), held_rows))
            out.append(_row(DATASET, name, f"{metric}_sd", float(np.std(values)), held_rows))
    for name, shares in swept.items():
        mean = float(np.mean(shares))
        out.append(
            _row(f"{DATASET}, amounts 1e4..1e308", name, "silent_low_share", mean, len(SWEEP))
        )
    return out


def _row(dataset: str, method: str, metric: str, value: float, n: int) -> dict:
    return {
        "dataset": dataset,
        "method": method,
        "metric": metric,
        "value": round(value, 4),
        "n": n,
    }


def table(rows: Sequence[dict]) -> str:
    """The rows as a Markdown table, one line per dataset and method, one column per metric."""
    return metric_table(list(rows), "n", 3)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=CREDITCARD)
    parser.add_argument("--seeds", type=int, default=len(SEEDS))
    args = parser.parse_args(argv)
    print(table(evaluate(args.data, seeds=range(args.seeds))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
